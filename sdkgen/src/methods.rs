//! The Rust method table (`proto/src/methods.rs`), included by
//! `openshell-proto` as `METHODS`. sdk-core's routing reads it: which methods
//! are owner-routed and which request field names the sandbox.

use std::fmt::Write as _;

use crate::{Contract, MARKER, kind, owner_routed_field};

pub fn rust_table(contract: &Contract) -> anyhow::Result<String> {
    let mut code = format!(
        "// {MARKER}\n\
         // Every RPC of every service in proto/openshell/*.proto: path, streaming kind,\n\
         // request and response types, and the `owner_routed` request field.\n\
         \n\
         /// Every RPC of the contract, in proto order.\n\
         pub static METHODS: &[MethodInfo] = &[\n"
    );
    let mut services: Vec<_> = contract.pool.services().collect();
    // Files in name order, services in file order: a stable table.
    services.sort_by(|a, b| {
        a.parent_file()
            .name()
            .cmp(b.parent_file().name())
            .then(a.index().cmp(&b.index()))
    });
    for service in services {
        for method in service.methods() {
            let routed = match owner_routed_field(&contract.pool, &method)? {
                Some(field) => format!("Some({field:?})"),
                None => "None".to_owned(),
            };
            writeln!(
                code,
                "    MethodInfo {{\n        \
                 path: \"/{}/{}\",\n        \
                 name: {:?},\n        \
                 kind: StreamingKind::{},\n        \
                 request: {:?},\n        \
                 response: {:?},\n        \
                 owner_routed_field: {routed},\n    \
                 }},",
                service.full_name(),
                method.name(),
                method.name(),
                kind(&method),
                method.input().full_name(),
                method.output().full_name(),
            )?;
        }
    }
    code.push_str("];\n");
    Ok(code)
}
