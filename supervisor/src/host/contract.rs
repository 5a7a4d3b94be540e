//! Stand-in for sdk-core's `HostSession` until it lands (same API).
#![allow(dead_code)]

use std::collections::BTreeMap;

use openshell_sdk::{ClientConfig, ConfigSession, ConfigSessionBuilder};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

pub enum HostEvent {
    Accepted {
        session_id: String,
        served_by: Option<String>,
    },
    Assignment(Vec<AssignedSandbox>),
    Ended,
}

pub struct AssignedSandbox {
    pub sandbox_id: String,
    pub name: String,
    pub environment: BTreeMap<String, String>,
}

#[derive(Clone)]
pub struct HostSession {
    config: ClientConfig,
}

pub struct HostSessionBuilder {
    config: ClientConfig,
}

impl HostSession {
    pub fn builder(config: ClientConfig, _member_id: impl Into<String>) -> HostSessionBuilder {
        HostSessionBuilder { config }
    }

    pub async fn run(&self, cancel: CancellationToken) -> Result<(), openshell_sdk::Error> {
        cancel.cancelled().await;
        Ok(())
    }

    pub fn sandbox_session(&self, sandbox_id: &str) -> ConfigSessionBuilder {
        ConfigSession::builder(self.config.clone(), sandbox_id)
    }
}

impl HostSessionBuilder {
    pub fn instance_id(self, _id: String) -> Self {
        self
    }
    pub fn capacity(self, _capacity: u32) -> Self {
        self
    }
    pub fn events(self, _events: mpsc::Sender<HostEvent>) -> Self {
        self
    }
    pub fn build(self) -> Result<HostSession, openshell_sdk::Error> {
        Ok(HostSession {
            config: self.config,
        })
    }
}
