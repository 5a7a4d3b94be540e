//! In-process fan-out of sandbox changes to `WatchSandbox` streams.
//! A watcher that falls behind re-reads the record instead of failing.

use openshell_proto::Sandbox;
use tokio::sync::broadcast;

#[derive(Debug, Clone)]
pub enum Change {
    Updated(Box<Sandbox>),
    Deleted { id: String },
}

impl Change {
    pub fn id(&self) -> &str {
        match self {
            Change::Updated(s) => s
                .metadata
                .as_ref()
                .map(|m| m.id.as_str())
                .unwrap_or_default(),
            Change::Deleted { id } => id,
        }
    }
}

pub struct WatchHub {
    tx: broadcast::Sender<Change>,
}

impl WatchHub {
    pub fn new() -> Self {
        let (tx, _) = broadcast::channel(1024);
        Self { tx }
    }

    pub fn publish(&self, change: Change) {
        // No receivers is fine.
        let _ = self.tx.send(change);
    }

    pub fn subscribe(&self) -> broadcast::Receiver<Change> {
        self.tx.subscribe()
    }
}
