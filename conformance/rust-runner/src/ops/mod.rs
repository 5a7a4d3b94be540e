//! The ops of `scenarios.json`, one module per area of the SDK. Each op is a
//! `Runner` method that performs a step and returns the observed `result`
//! object (README: "Observations"); an SDK error is returned as is.

mod config;
mod exec;
mod files;
mod forward;
mod logs;
mod raw;
mod replica_control;
mod sandboxes;
