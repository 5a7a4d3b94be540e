//! `up --control stdin`: orders on standard input, one a line, each
//! answered on standard output once it is carried out (`control: ok ...`
//! or `control: error ...`); the end of the input stops the cluster.
//!
//! - `stop|kill|start|restart NAME`: a process, by the name its banner
//!   prints; carried out by its task ([`process::supervise`]).
//! - `cut-route ID` / `restore-route ID`: the edge loses (or gets back) its
//!   route to replica ID. `up` keeps the edge's routes in a file the edge
//!   re-reads on SIGHUP ([`EdgeRoutes`]); without the route a call hinted to
//!   ID is answered "not forwarded" by the edge (the SDKs' single unrouted
//!   retry) and unhinted calls go to the other replicas. Streams already
//!   open through the edge keep running.
//! - `slow-store MS`, `cut-store`, `restore-store`: every replica's store
//!   calls wait MS milliseconds first, or (cut) fail after their deadline
//!   as on a frozen database, or neither. `up` writes the fault file the
//!   replicas follow (`serve --store-fault-file`) and answers once every
//!   running replica reports the fault in force on its metrics
//!   ([`StoreFaults`]).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::board::Board;
use super::process::{self, Action};
use super::{gauge, say};

/// The edge's routes as `up` wants them: every replica's URL, minus the
/// routes cut by an order, in the routes file the edge reads.
pub struct EdgeRoutes {
    file: PathBuf,
    /// The edge's ready file, for its metrics address.
    edge_ready: PathBuf,
    all: BTreeMap<String, String>,
    cut: BTreeSet<String>,
}

impl EdgeRoutes {
    pub fn new(file: PathBuf, edge_ready: PathBuf) -> Self {
        Self {
            file,
            edge_ready,
            all: BTreeMap::new(),
            cut: BTreeSet::new(),
        }
    }

    pub fn file(&self) -> &std::path::Path {
        &self.file
    }

    /// Adds a replica's route (before the edge starts).
    pub fn add(&mut self, id: &str, url: &str) {
        self.all.insert(id.to_owned(), url.to_owned());
    }

    /// Writes the routes file (a temporary file renamed over it).
    pub fn write(&self) -> std::io::Result<()> {
        let replicas: BTreeMap<&String, &String> = self
            .all
            .iter()
            .filter(|(id, _)| !self.cut.contains(*id))
            .collect();
        let text = serde_json::json!({ "replicas": replicas }).to_string();
        let tmp = self.file.with_extension("json.tmp");
        std::fs::write(&tmp, text)?;
        std::fs::rename(&tmp, &self.file)
    }

    /// Cuts or restores `id`'s route, then has the running edge re-read
    /// the file and waits (at most 10 s) until it serves that many routes.
    async fn set(&mut self, id: &str, cut: bool, board: &Board) -> Result<String, String> {
        if !self.all.contains_key(id) {
            let known: Vec<&String> = self.all.keys().collect();
            return Err(format!(
                "no replica named {id:?}: the replicas are {known:?}"
            ));
        }
        let changed = match cut {
            true => self.cut.insert(id.to_owned()),
            false => self.cut.remove(id),
        };
        let done = match cut {
            true => format!("route to {id} cut"),
            false => format!("route to {id} restored"),
        };
        if !changed {
            return Ok(done);
        }
        self.write()
            .map_err(|err| format!("writing {}: {err}", self.file.display()))?;
        let Some(edge) = board.pid_of("edge") else {
            // The edge reads the file when it starts.
            return Ok(format!("{done} (the edge is down)"));
        };
        // SAFETY: kill(2) has no memory-safety preconditions. The board
        // names a PID only while the edge's task holds it unreaped or has
        // just reaped it (it clears the PID right after); the edge installs
        // its SIGHUP handler before it writes its ready file.
        unsafe {
            libc::kill(edge as i32, libc::SIGHUP);
        }
        let want = (self.all.len() - self.cut.len()) as f64;
        let begun = Instant::now();
        while begun.elapsed() < Duration::from_secs(10) {
            if let Some(addr) = self.edge_metrics()
                && gauge(&addr, "openshell_edge_replicas").await == Some(want)
            {
                return Ok(done);
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Err(format!(
            "the edge did not take the new routes within 10 s ({done} in the file)"
        ))
    }

    fn edge_metrics(&self) -> Option<String> {
        let text = std::fs::read_to_string(&self.edge_ready).ok()?;
        let ready: serde_json::Value = serde_json::from_str(&text).ok()?;
        ready["metrics"].as_str().map(str::to_owned)
    }
}

/// The store fault every replica follows, in the file they re-read.
pub struct StoreFaults {
    file: PathBuf,
    /// Replica id -> its metrics address.
    replicas: BTreeMap<String, String>,
}

impl StoreFaults {
    pub fn new(file: PathBuf) -> Self {
        Self {
            file,
            replicas: BTreeMap::new(),
        }
    }

    /// The file, as a replica's argument.
    pub fn file_arg(&self) -> String {
        self.file.display().to_string()
    }

    pub fn add(&mut self, id: &str, metrics: &str) {
        self.replicas.insert(id.to_owned(), metrics.to_owned());
    }

    /// Writes the fault, then waits (at most 10 s) until every running
    /// replica has it in force.
    async fn set(&self, delay_ms: u64, down: bool, board: &Board) -> Result<String, String> {
        let text = serde_json::json!({ "delay_ms": delay_ms, "down": down }).to_string();
        let tmp = self.file.with_extension("json.tmp");
        std::fs::write(&tmp, text)
            .and_then(|()| std::fs::rename(&tmp, &self.file))
            .map_err(|err| format!("writing {}: {err}", self.file.display()))?;
        let done = match (down, delay_ms) {
            (true, _) => "store cut".to_owned(),
            (false, 0) => "store restored".to_owned(),
            (false, ms) => format!("store slowed by {ms} ms"),
        };
        let begun = Instant::now();
        while begun.elapsed() < Duration::from_secs(10) {
            let mut all = true;
            for (id, addr) in &self.replicas {
                if board.pid_of(id).is_none() {
                    continue; // a replica started later reads the file first
                }
                let delay = gauge(addr, "openshell_store_fault_delay_ms").await;
                let cut = gauge(addr, "openshell_store_fault_down").await;
                if delay != Some(delay_ms as f64) || cut != Some(f64::from(u8::from(down))) {
                    all = false;
                    break;
                }
            }
            if all {
                return Ok(done);
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Err(format!(
            "the replicas did not take the store fault within 10 s ({done} in the file)"
        ))
    }
}

/// One parsed order line.
#[derive(Debug, PartialEq, Eq)]
enum Parsed<'a> {
    Process(&'static [Action], &'a str),
    Route { cut: bool, id: &'a str },
    Store { delay_ms: u64, down: bool },
}

const USAGE: &str = "an order is `stop|kill|start|restart NAME`, `cut-route|restore-route ID`, \
                     `slow-store MS`, `cut-store` or `restore-store`";

/// The longest store delay an order may set (beyond any call's deadline).
const MAX_STORE_DELAY_MS: u64 = 600_000;

fn parse(line: &str) -> Result<Parsed<'_>, String> {
    use Action::{Kill, Start, Stop};
    let mut words = line.split_whitespace();
    let (verb, name) = match (words.next(), words.next(), words.next()) {
        (Some("cut-store"), None, None) => {
            return Ok(Parsed::Store {
                delay_ms: 0,
                down: true,
            });
        }
        (Some("restore-store"), None, None) => {
            return Ok(Parsed::Store {
                delay_ms: 0,
                down: false,
            });
        }
        (Some("slow-store"), Some(ms), None) => {
            return match ms.parse::<u64>() {
                Ok(delay_ms) if delay_ms <= MAX_STORE_DELAY_MS => Ok(Parsed::Store {
                    delay_ms,
                    down: false,
                }),
                _ => Err(format!(
                    "slow-store takes milliseconds, 0 to {MAX_STORE_DELAY_MS}, not {ms:?}"
                )),
            };
        }
        (Some(verb), Some(name), None) => (verb, name),
        _ => return Err(USAGE.into()),
    };
    let actions: &'static [Action] = match verb {
        "stop" => &[Stop],
        "kill" => &[Kill],
        "start" => &[Start],
        "restart" => &[Stop, Start],
        "cut-route" => {
            return Ok(Parsed::Route {
                cut: true,
                id: name,
            });
        }
        "restore-route" => {
            return Ok(Parsed::Route {
                cut: false,
                id: name,
            });
        }
        other => {
            return Err(format!(
                "unknown order {other:?}: stop, kill, start, restart, cut-route, \
                 restore-route, slow-store, cut-store or restore-store"
            ));
        }
    };
    Ok(Parsed::Process(actions, name))
}

/// Reads orders from standard input until it ends (then `ended` fires),
/// answering each on standard output.
pub async fn take_orders(
    orders: HashMap<String, mpsc::Sender<process::Order>>,
    mut routes: EdgeRoutes,
    store: StoreFaults,
    board: Arc<Board>,
    ended: CancellationToken,
) {
    use tokio::io::AsyncBufReadExt;
    let mut lines = tokio::io::BufReader::new(tokio::io::stdin()).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        let answer = match parse(&line) {
            Err(err) => Err(err),
            Ok(Parsed::Route { cut, id }) => routes.set(id, cut, &board).await,
            Ok(Parsed::Store { delay_ms, down }) => store.set(delay_ms, down, &board).await,
            Ok(Parsed::Process(actions, name)) => match orders.get(name) {
                None => Err(format!("no process named {name:?}")),
                Some(tx) => {
                    let mut answer = Err("no action".to_owned());
                    for action in actions {
                        answer = send(tx, *action).await;
                        if answer.is_err() {
                            break;
                        }
                    }
                    answer
                }
            },
        };
        match answer {
            Ok(text) => say(&format!("control: ok {text}")),
            Err(text) => say(&format!("control: error {text}")),
        }
    }
    ended.cancel();
}

async fn send(tx: &mpsc::Sender<process::Order>, action: Action) -> Result<String, String> {
    let (done, answer) = tokio::sync::oneshot::channel();
    tx.send(process::Order { action, done })
        .await
        .map_err(|_| "up is stopping".to_owned())?;
    answer.await.map_err(|_| "up is stopping".to_owned())?
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn orders_parse_and_bad_ones_say_why() {
        assert_eq!(
            parse("kill gw-1").unwrap(),
            Parsed::Process(&[Action::Kill], "gw-1")
        );
        assert_eq!(
            parse(" restart  edge ").unwrap(),
            Parsed::Process(&[Action::Stop, Action::Start], "edge")
        );
        assert_eq!(
            parse("cut-route gw-2").unwrap(),
            Parsed::Route {
                cut: true,
                id: "gw-2"
            }
        );
        assert_eq!(
            parse("restore-route gw-2").unwrap(),
            Parsed::Route {
                cut: false,
                id: "gw-2"
            }
        );
        assert!(
            parse("kill")
                .unwrap_err()
                .contains("stop|kill|start|restart NAME")
        );
        assert!(parse("kill gw-1 now").is_err());
        assert_eq!(
            parse("slow-store 250").unwrap(),
            Parsed::Store {
                delay_ms: 250,
                down: false
            }
        );
        assert_eq!(
            parse("cut-store").unwrap(),
            Parsed::Store {
                delay_ms: 0,
                down: true
            }
        );
        assert_eq!(
            parse("restore-store").unwrap(),
            Parsed::Store {
                delay_ms: 0,
                down: false
            }
        );
        for bad in [
            "slow-store",
            "slow-store soon",
            "slow-store 600001",
            "cut-store now",
        ] {
            assert!(parse(bad).is_err(), "{bad}");
        }
        assert!(parse("explode gw-1").unwrap_err().contains("unknown order"));
    }

    #[test]
    fn the_routes_file_leaves_out_cut_routes() {
        let dir = tempfile::tempdir().unwrap();
        let mut routes = EdgeRoutes::new(dir.path().join("routes.json"), dir.path().join("x"));
        routes.add("gw-0", "http://127.0.0.1:1");
        routes.add("gw-1", "http://127.0.0.1:2");
        routes.cut.insert("gw-1".into());
        routes.write().unwrap();
        let text = std::fs::read_to_string(routes.file()).unwrap();
        assert_eq!(text, r#"{"replicas":{"gw-0":"http://127.0.0.1:1"}}"#);
    }
}
