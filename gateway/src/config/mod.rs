//! Sandbox configuration (seed 002): the model (`model`: policies, settings,
//! providers and the snapshots supervisors receive, all in the store) and
//! its delivery (`delivery`: push over the supervisor session, or poll).
//!
//! May import `sandboxes`, `sessions`, `cluster` and the low layers; never
//! `api` or `serve`.

pub mod delivery;
pub mod model;
