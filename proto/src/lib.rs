//! The OpenShell wire contract as Rust types: prost messages and tonic
//! client/server stubs generated from `proto/openshell/*.proto` at build time.
//!
//! The `.proto` files are the source of truth; nothing in this crate is
//! written by hand except these module declarations.

#![allow(clippy::all, missing_docs)]

pub mod openshell {
    pub mod v1 {
        tonic::include_proto!("openshell.v1");
    }
    pub mod datamodel {
        pub mod v1 {
            tonic::include_proto!("openshell.datamodel.v1");
        }
    }
    pub mod peer {
        pub mod v1 {
            tonic::include_proto!("openshell.peer.v1");
        }
    }
    pub mod options {
        pub mod v1 {
            tonic::include_proto!("openshell.options.v1");
        }
    }
}

pub use openshell::datamodel::v1 as datamodel;
pub use openshell::peer::v1 as peer;
pub use openshell::v1::*;

/// Encoded `FileDescriptorSet` of the whole contract (with source info), for
/// tools that read method options such as `owner_routed`.
pub const FILE_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/openshell_descriptor.bin"));

/// gRPC service name of the client-facing API.
pub const SERVICE: &str = "openshell.v1.OpenShell";

/// How a method streams.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StreamingKind {
    Unary,
    ServerStreaming,
    ClientStreaming,
    BidiStreaming,
}

/// One RPC of the contract, as generated from the `.proto` files.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MethodInfo {
    /// gRPC path, `/openshell.v1.OpenShell/ExecSandbox`.
    pub path: &'static str,
    /// Method name, `ExecSandbox`.
    pub name: &'static str,
    pub kind: StreamingKind,
    /// Fully qualified request message name.
    pub request: &'static str,
    /// Fully qualified response message name.
    pub response: &'static str,
    /// For owner-routed methods: dotted path of the request field naming the
    /// sandbox (in the first message of a client stream).
    pub owner_routed_field: Option<&'static str>,
}

include!(concat!(env!("OUT_DIR"), "/methods.rs"));

/// Looks a method up by its gRPC path.
pub fn method(path: &str) -> Option<&'static MethodInfo> {
    METHODS.iter().find(|m| m.path == path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn method_table_marks_owner_routed_streams() {
        let exec = method("/openshell.v1.OpenShell/ExecSandbox").unwrap();
        assert_eq!(exec.kind, StreamingKind::ServerStreaming);
        assert_eq!(exec.owner_routed_field, Some("sandbox"));
        let fwd = method("/openshell.v1.OpenShell/ForwardTcp").unwrap();
        assert_eq!(fwd.kind, StreamingKind::BidiStreaming);
        assert_eq!(fwd.owner_routed_field, Some("init.sandbox"));
        let get = method("/openshell.v1.OpenShell/GetSandbox").unwrap();
        assert_eq!(get.owner_routed_field, None);
        assert_eq!(get.kind, StreamingKind::Unary);
    }
}
