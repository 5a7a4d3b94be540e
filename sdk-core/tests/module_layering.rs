//! The module graph of the crate stays acyclic and layered as the crate docs
//! (`src/lib.rs`, "Layering") say: a module imports only modules of lower
//! layers.
//!
//! Nodes are the top-level modules (`mod x;` in `lib.rs`, plus the inline
//! `paths`); an edge is a `crate::x` (or a `super::x` that leaves the
//! module) in code, tests and comments excluded. A root re-export
//! (`crate::Client`) counts as an edge to the module that defines it.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Layer of every top-level module; lower layers never import higher ones.
const LAYERS: &[(&str, u8)] = &[
    ("metadata", 0),
    ("paths", 0),
    ("wire", 0),
    ("error", 1),
    ("auth", 2),
    ("config", 3),
    ("transport", 4),
    ("routing", 4),
    ("client", 5),
    ("raw", 6),
    ("sandboxes", 7),
    ("exec", 7),
    ("forward", 7),
    ("config_session", 7),
    ("host_session", 8),
    ("files", 8),
    ("logs", 8),
    ("ssh", 7),
    ("testing", 9),
];

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// The files of a top-level module with their depth below it.
fn files_of(module: &str) -> Vec<(PathBuf, usize)> {
    let single = src().join(format!("{module}.rs"));
    if single.exists() {
        return vec![(single, 0)];
    }
    let mut out = Vec::new();
    let mut stack = vec![(src().join(module), 0usize)];
    while let Some((dir, depth)) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{dir:?}: {e}")) {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push((path, depth + 1));
            } else if path.file_name().is_some_and(|n| n == "mod.rs") {
                out.push((path, depth));
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push((path, depth + 1));
            }
        }
    }
    assert!(!out.is_empty(), "no files for module {module}");
    out
}

/// The code of a file without comments and without `#[cfg(test)]` items.
fn code_of(text: &str) -> String {
    let mut code = String::new();
    for line in text.lines() {
        let trimmed = line.trim_start();
        if trimmed.starts_with("//") {
            continue;
        }
        let line = match line.find(" // ") {
            Some(at) => &line[..at],
            None => line,
        };
        code.push_str(line);
        code.push('\n');
    }
    // Drop each `#[cfg(test)]` item: up to its `;` or its matching brace.
    while let Some(start) = code.find("#[cfg(test)]") {
        let rest = &code[start..];
        let end = match (rest.find('{'), rest.find(';')) {
            (Some(open), semi) if semi.is_none_or(|s| open < s) => {
                let mut depth = 0usize;
                let mut end = rest.len();
                for (i, c) in rest.char_indices().skip(open) {
                    match c {
                        '{' => depth += 1,
                        '}' => {
                            depth -= 1;
                            if depth == 0 {
                                end = i + 1;
                                break;
                            }
                        }
                        _ => {}
                    }
                }
                end
            }
            (_, Some(semi)) => semi + 1,
            _ => rest.len(),
        };
        code.replace_range(start..start + end, "");
    }
    code
}

/// Root re-exports: item name -> the module it comes from.
fn root_reexports(lib: &str) -> BTreeMap<String, String> {
    let mut map = BTreeMap::new();
    let code = code_of(lib);
    for statement in code.split(';') {
        let statement = statement.trim();
        let Some(rest) = statement.strip_prefix("pub use ") else {
            continue;
        };
        let Some((module, items)) = rest.split_once("::") else {
            continue;
        };
        let items = items.trim().trim_start_matches('{').trim_end_matches('}');
        for item in items.split(',') {
            let item = item.trim();
            if !item.is_empty() {
                map.insert(item.to_owned(), module.to_owned());
            }
        }
    }
    map
}

fn ident_at(text: &str) -> &str {
    let end = text
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .unwrap_or(text.len());
    &text[..end]
}

/// Names a piece of code reaches at the crate root.
fn root_references(code: &str, depth: usize) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut add_path = |after: &str| {
        if let Some(group) = after.strip_prefix('{') {
            let group = &group[..group.find('}').unwrap_or(group.len())];
            for part in group.split(',') {
                let name = ident_at(part.trim());
                if !name.is_empty() {
                    names.insert(name.to_owned());
                }
            }
        } else {
            let name = ident_at(after);
            if !name.is_empty() {
                names.insert(name.to_owned());
            }
        }
    };
    for (at, _) in code.match_indices("crate::") {
        let before = code[..at].chars().next_back();
        if before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_') {
            continue; // `$crate::` or `foo_crate::`
        }
        add_path(&code[at + "crate::".len()..]);
    }
    for (at, _) in code.match_indices("super::") {
        if code[..at].ends_with("super::") {
            continue; // counted from the first `super::` of a chain
        }
        let mut rest = &code[at..];
        let mut ups = 0;
        while let Some(r) = rest.strip_prefix("super::") {
            ups += 1;
            rest = r;
        }
        if ups > depth {
            add_path(rest);
        }
    }
    names
}

fn module_graph() -> BTreeMap<String, BTreeSet<String>> {
    let lib = std::fs::read_to_string(src().join("lib.rs")).unwrap();
    let reexports = root_reexports(&lib);
    let modules: BTreeSet<&str> = LAYERS.iter().map(|(m, _)| *m).collect();
    let mut declared: BTreeSet<String> = code_of(&lib)
        .lines()
        .filter_map(|l| {
            let l = l.trim();
            let l = l.strip_prefix("pub ").unwrap_or(l);
            let l = l.strip_prefix("pub(crate) ").unwrap_or(l);
            l.strip_prefix("mod ")
                .map(|m| ident_at(m).to_owned())
                .filter(|m| !m.is_empty())
        })
        .collect();
    declared.remove("paths");
    for module in &declared {
        assert!(
            modules.contains(module.as_str()),
            "module {module} has no layer in this test and in the crate docs"
        );
    }
    let mut graph = BTreeMap::new();
    for module in declared {
        let mut edges = BTreeSet::new();
        for (file, depth) in files_of(&module) {
            let code = code_of(&std::fs::read_to_string(&file).unwrap());
            for name in root_references(&code, depth) {
                let target = if modules.contains(name.as_str()) {
                    Some(name)
                } else {
                    reexports.get(&name).cloned()
                };
                if let Some(target) =
                    target.filter(|t| *t != module && modules.contains(t.as_str()))
                {
                    edges.insert(target);
                }
            }
        }
        graph.insert(module, edges);
    }
    graph.insert("paths".to_owned(), BTreeSet::new());
    graph
}

#[test]
fn modules_import_only_lower_layers() {
    let layer: BTreeMap<&str, u8> = LAYERS.iter().copied().collect();
    let graph = module_graph();
    let mut violations = Vec::new();
    for (module, edges) in &graph {
        for target in edges {
            if layer[target.as_str()] >= layer[module.as_str()] {
                violations.push(format!("{module} -> {target}"));
            }
        }
    }
    assert!(
        violations.is_empty(),
        "imports against the layering: {violations:?}\ngraph: {graph:#?}"
    );
    // Strictly decreasing layers along every edge: no cycle is possible.
    // The edges the crate docs name explicitly:
    assert!(graph["raw"].contains("routing"));
    assert!(!graph["routing"].contains("raw"));
}

#[test]
fn the_parser_sees_edges_and_skips_tests() {
    let code = code_of(
        "use crate::a::X;\nuse crate::{b, c::Y};\n// use crate::d;\nfn f() { super::e::g(); }\n\
         #[cfg(test)]\nmod tests {\n    use crate::h;\n}\n",
    );
    let names = root_references(&code, 0);
    assert_eq!(names.into_iter().collect::<Vec<_>>(), ["a", "b", "c", "e"]);
    assert!(root_references("use super::x;", 1).is_empty());
    assert!(root_references("use super::super::x;", 1).contains("x"));
}

/// Prints the graph (`cargo test -p openshell-sdk --test module_layering -- --nocapture`).
#[test]
fn print_module_graph() {
    for (module, edges) in module_graph() {
        println!(
            "{module} -> {}",
            edges.into_iter().collect::<Vec<_>>().join(", ")
        );
    }
}
