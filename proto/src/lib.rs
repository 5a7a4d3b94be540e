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
    pub mod options {
        pub mod v1 {
            tonic::include_proto!("openshell.options.v1");
        }
    }
}

pub use openshell::datamodel::v1 as datamodel;
pub use openshell::v1::*;

/// Encoded `FileDescriptorSet` of the whole contract (with source info), for
/// tools that read method options such as `owner_routed`.
pub const FILE_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/openshell_descriptor.bin"));

/// gRPC service name of the client-facing API.
pub const SERVICE: &str = "openshell.v1.OpenShell";
