//! The gRPC surface of a replica: the OpenShell service (`service`, with the
//! long-lived streams in `streams` and `forward`), the raw relay routes
//! that serve them and `RelayStream` without tonic's codec (`raw_routes`), the supervisor host service (`hosts`), the peer service
//! other replicas call (`peer`), SSH session tokens (`ssh_sessions`), and
//! the request layer every call passes through (`request_layer`:
//! authentication, `x-openshell-served-by`, request metrics, relay routing
//! of owner-routed streams).
//!
//! The top layer below `serve`: it may import every other module; nothing
//! but `serve` imports it.

pub mod forward;
pub mod hosts;
pub mod peer;
pub mod raw_routes;
pub mod request_layer;
pub mod service;
pub mod ssh_sessions;
pub mod streams;
