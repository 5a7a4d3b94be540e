//! `openshell-modcheck`: no two modules of a crate import each other in a
//! circle.
//!
//! For every crate of the workspace (its `src/lib.rs` and `src/main.rs`),
//! the nodes are the crate's top-level modules and an edge `a -> b` means
//! code under `a` names `crate::b` (or reaches `b` through `super::`), in a
//! `use`, a path, or a macro's tokens. Test code (`#[cfg(test)]` items) does
//! not count. A cycle fails the check with the modules and one reference per
//! edge, so the fix is obvious; `--graph` prints every crate's graph.
//!
//! Usage: `cargo run -p openshell-modcheck -- [--graph] [WORKSPACE_DIR]`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, bail};
use proc_macro2::{TokenStream, TokenTree};
use syn::visit::Visit;

/// One crate's module graph: edges with the first place each was seen.
#[derive(Default)]
struct Graph {
    nodes: BTreeSet<String>,
    edges: BTreeMap<(String, String), String>,
}

fn main() -> ExitCode {
    let mut graph_out = false;
    let mut root = PathBuf::from(".");
    for arg in std::env::args().skip(1) {
        match arg.as_str() {
            "--graph" => graph_out = true,
            other => root = PathBuf::from(other),
        }
    }
    match run(&root, graph_out) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(err) => {
            eprintln!("modcheck: {err:#}");
            ExitCode::from(2)
        }
    }
}

fn run(root: &Path, graph_out: bool) -> anyhow::Result<bool> {
    let mut clean = true;
    let mut crates = 0;
    for member in workspace_members(root)? {
        for entry in ["src/lib.rs", "src/main.rs"] {
            let file = member.join(entry);
            if !file.exists() {
                continue;
            }
            crates += 1;
            let graph = crate_graph(&file)?;
            let name = format!("{} ({entry})", member.display());
            if graph_out {
                print_graph(&name, &graph);
            }
            for cycle in cycles(&graph) {
                clean = false;
                println!("modcheck: {name}: modules import each other in a circle:");
                for pair in cycle.windows(2) {
                    let place = &graph.edges[&(pair[0].clone(), pair[1].clone())];
                    println!("  {} -> {}   ({place})", pair[0], pair[1]);
                }
            }
        }
    }
    if clean {
        println!("modcheck: {crates} crate roots, no module cycles");
    }
    Ok(clean)
}

/// Member directories from the workspace's `Cargo.toml` (`members = [...]`).
fn workspace_members(root: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let manifest = std::fs::read_to_string(root.join("Cargo.toml"))
        .with_context(|| format!("reading {}/Cargo.toml", root.display()))?;
    let start = manifest
        .find("members")
        .context("no `members` in the workspace manifest")?;
    let list = &manifest[start..];
    let open = list.find('[').context("members is not a list")?;
    let close = list.find(']').context("members is not a list")?;
    Ok(list[open + 1..close]
        .split(',')
        .map(|m| m.trim().trim_matches('"'))
        .filter(|m| !m.is_empty())
        .map(|m| root.join(m))
        .collect())
}

fn parse(file: &Path) -> anyhow::Result<syn::File> {
    let text =
        std::fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))?;
    syn::parse_file(&text).with_context(|| format!("parsing {}", file.display()))
}

fn is_test(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|attr| {
        attr.path().is_ident("cfg")
            && attr
                .meta
                .require_list()
                .is_ok_and(|list| list.tokens.to_string().contains("test"))
    })
}

/// The graph of the crate rooted at `root_file`.
fn crate_graph(root_file: &Path) -> anyhow::Result<Graph> {
    let root = parse(root_file)?;
    let dir = root_file.parent().expect("a crate root is in src/");
    let mut graph = Graph::default();
    let mut modules = Vec::new();
    for item in &root.items {
        if let syn::Item::Mod(module) = item
            && !is_test(&module.attrs)
        {
            graph.nodes.insert(module.ident.to_string());
            modules.push(module.clone());
        }
    }
    for module in modules {
        let name = module.ident.to_string();
        let mut collector = Collector {
            top: &name,
            nodes: &graph.nodes,
            found: BTreeMap::new(),
            file: PathBuf::new(),
            depth: 1,
        };
        walk_module(&module, dir, std::slice::from_ref(&name), 1, &mut collector)?;
        for (target, place) in collector.found {
            graph.edges.entry((name.clone(), target)).or_insert(place);
        }
    }
    Ok(graph)
}

/// Visits a module's own items, then its file children.
fn walk_module(
    module: &syn::ItemMod,
    src: &Path,
    path: &[String],
    depth: usize,
    collector: &mut Collector<'_>,
) -> anyhow::Result<()> {
    let (attrs, items) = match &module.content {
        Some((_, items)) => (Vec::new(), items.clone()),
        None => {
            let file = module_file(src, path)?;
            collector.file = file.clone();
            let parsed = parse(&file)?;
            (parsed.attrs, parsed.items)
        }
    };
    collector.depth = depth;
    // The file's own `//!` docs: an intra-doc link names a module too.
    for attr in &attrs {
        collector.visit_attribute(attr);
    }
    for item in &items {
        match item {
            syn::Item::Mod(child) if !is_test(&child.attrs) => {
                let mut child_path = path.to_vec();
                child_path.push(child.ident.to_string());
                let file = collector.file.clone();
                walk_module(child, src, &child_path, depth + 1, collector)?;
                collector.file = file;
                collector.depth = depth;
            }
            syn::Item::Mod(_) => {}
            other if has_test_attr(other) => {}
            other => collector.visit_item(other),
        }
    }
    Ok(())
}

fn has_test_attr(item: &syn::Item) -> bool {
    let attrs = match item {
        syn::Item::Fn(f) => &f.attrs,
        syn::Item::Use(u) => &u.attrs,
        syn::Item::Impl(i) => &i.attrs,
        syn::Item::Struct(s) => &s.attrs,
        syn::Item::Const(c) => &c.attrs,
        _ => return false,
    };
    is_test(attrs)
}

/// `src/a/b.rs` or `src/a/b/mod.rs` for the module path `a::b`.
fn module_file(src: &Path, path: &[String]) -> anyhow::Result<PathBuf> {
    let joined: PathBuf = path.iter().collect();
    let flat = src.join(&joined).with_extension("rs");
    if flat.exists() {
        return Ok(flat);
    }
    let nested = src.join(&joined).join("mod.rs");
    if nested.exists() {
        return Ok(nested);
    }
    bail!("no file for module {}", path.join("::"))
}

/// Collects the top-level modules one top-level module names.
struct Collector<'a> {
    top: &'a str,
    nodes: &'a BTreeSet<String>,
    found: BTreeMap<String, String>,
    file: PathBuf,
    /// How deep the current module is below the crate root.
    depth: usize,
}

impl Collector<'_> {
    /// `segments` of a path as written; records the module it reaches.
    fn reference(&mut self, segments: &[String]) {
        let target = match segments.first().map(String::as_str) {
            Some("crate") => segments.get(1),
            Some("super") => {
                let supers = segments.iter().take_while(|s| *s == "super").count();
                // From depth d, d supers reach the crate root.
                (supers == self.depth)
                    .then(|| segments.get(supers))
                    .flatten()
            }
            _ => None,
        };
        if let Some(target) = target
            && target != self.top
            && self.nodes.contains(target)
        {
            self.found
                .entry(target.clone())
                .or_insert_with(|| format!("{}: {}", self.file.display(), segments.join("::")));
        }
    }

    fn use_tree(&mut self, prefix: &mut Vec<String>, tree: &syn::UseTree) {
        match tree {
            syn::UseTree::Path(path) => {
                prefix.push(path.ident.to_string());
                self.use_tree(prefix, &path.tree);
                prefix.pop();
            }
            syn::UseTree::Name(name) => {
                prefix.push(name.ident.to_string());
                self.reference(prefix);
                prefix.pop();
            }
            syn::UseTree::Rename(rename) => {
                prefix.push(rename.ident.to_string());
                self.reference(prefix);
                prefix.pop();
            }
            syn::UseTree::Glob(_) => self.reference(prefix),
            syn::UseTree::Group(group) => {
                for tree in &group.items {
                    self.use_tree(prefix, tree);
                }
            }
        }
    }

    /// `crate :: x` and `super :: ... :: x` sequences in macro tokens.
    fn tokens(&mut self, tokens: &TokenStream) {
        let flat: Vec<TokenTree> = tokens.clone().into_iter().collect();
        let mut i = 0;
        while i < flat.len() {
            if let TokenTree::Group(group) = &flat[i] {
                self.tokens(&group.stream());
            }
            if let TokenTree::Ident(ident) = &flat[i]
                && (ident == "crate" || ident == "super")
            {
                let mut segments = vec![ident.to_string()];
                let mut j = i + 1;
                while j + 2 < flat.len() + 1 {
                    let colons = matches!((&flat.get(j), &flat.get(j + 1)),
                        (Some(TokenTree::Punct(a)), Some(TokenTree::Punct(b))) if a.as_char() == ':' && b.as_char() == ':');
                    match (colons, flat.get(j + 2)) {
                        (true, Some(TokenTree::Ident(next))) => {
                            segments.push(next.to_string());
                            j += 3;
                        }
                        _ => break,
                    }
                }
                self.reference(&segments);
                i = j;
                continue;
            }
            i += 1;
        }
    }
}

impl<'ast> Visit<'ast> for Collector<'_> {
    fn visit_item_use(&mut self, item: &'ast syn::ItemUse) {
        if !is_test(&item.attrs) {
            self.use_tree(&mut Vec::new(), &item.tree);
        }
    }

    fn visit_path(&mut self, path: &'ast syn::Path) {
        let segments: Vec<String> = path.segments.iter().map(|s| s.ident.to_string()).collect();
        self.reference(&segments);
        syn::visit::visit_path(self, path);
    }

    /// Doc comments: a link such as [`x`](crate::y) ties the module to `y`
    /// as much as a `use` does (rustdoc resolves it, and the reader follows
    /// it), so it counts.
    fn visit_attribute(&mut self, attr: &'ast syn::Attribute) {
        if attr.path().is_ident("doc")
            && let syn::Meta::NameValue(doc) = &attr.meta
            && let syn::Expr::Lit(syn::ExprLit {
                lit: syn::Lit::Str(text),
                ..
            }) = &doc.value
        {
            for segments in doc_paths(&text.value()) {
                self.reference(&segments);
            }
        }
    }

    fn visit_macro(&mut self, mac: &'ast syn::Macro) {
        self.tokens(&mac.tokens);
        syn::visit::visit_macro(self, mac);
    }

    fn visit_item_fn(&mut self, item: &'ast syn::ItemFn) {
        if !is_test(&item.attrs) {
            syn::visit::visit_item_fn(self, item);
        }
    }

    fn visit_impl_item_fn(&mut self, item: &'ast syn::ImplItemFn) {
        if !is_test(&item.attrs) {
            syn::visit::visit_impl_item_fn(self, item);
        }
    }
}

/// `crate::a::b` and `super::a` paths written in doc text, as segments.
fn doc_paths(text: &str) -> Vec<Vec<String>> {
    let is_ident = |c: char| c.is_ascii_alphanumeric() || c == '_';
    let mut found = Vec::new();
    for (at, _) in text
        .match_indices("crate::")
        .chain(text.match_indices("super::"))
    {
        if text[..at].chars().next_back().is_some_and(is_ident) {
            continue;
        }
        let segments: Vec<String> = text[at..]
            .split("::")
            .map(|s| s.chars().take_while(|c| is_ident(*c)).collect::<String>())
            .take_while(|s| !s.is_empty())
            .collect();
        found.push(segments);
    }
    found
}

/// One shortest cycle through each module no earlier cycle named: every
/// module that sits on a cycle is reported, without listing every
/// elementary cycle.
fn cycles(graph: &Graph) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    let mut reported: BTreeSet<String> = BTreeSet::new();
    for start in &graph.nodes {
        if reported.contains(start) {
            continue;
        }
        if let Some(cycle) = find_cycle(graph, start) {
            reported.extend(cycle.iter().cloned());
            out.push(cycle);
        }
    }
    out
}

/// A shortest path `start -> ... -> start`, by breadth-first search.
fn find_cycle(graph: &Graph, start: &str) -> Option<Vec<String>> {
    let next = |node: &str| -> Vec<String> {
        graph
            .edges
            .keys()
            .filter(|(from, _)| from == node)
            .map(|(_, to)| to.clone())
            .collect()
    };
    let mut parent: BTreeMap<String, String> = BTreeMap::new();
    let mut queue = std::collections::VecDeque::from([start.to_owned()]);
    while let Some(node) = queue.pop_front() {
        for to in next(&node) {
            if to == start {
                let mut cycle = vec![start.to_owned()];
                let mut at = node.clone();
                let mut back = vec![];
                while at != start {
                    back.push(at.clone());
                    at = parent[&at].clone();
                }
                back.reverse();
                cycle.extend(back);
                cycle.push(start.to_owned());
                return Some(cycle);
            }
            if !parent.contains_key(&to) && to != start {
                parent.insert(to.clone(), node.clone());
                queue.push_back(to);
            }
        }
    }
    None
}

fn print_graph(name: &str, graph: &Graph) {
    println!("{name}");
    for node in &graph.nodes {
        let targets: Vec<&str> = graph
            .edges
            .keys()
            .filter(|(from, _)| from == node)
            .map(|(_, to)| to.as_str())
            .collect();
        println!("  {node} -> {}", targets.join(", "));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn graph(edges: &[(&str, &str)]) -> Graph {
        let mut g = Graph::default();
        for (a, b) in edges {
            g.nodes.insert(a.to_string());
            g.nodes.insert(b.to_string());
            g.edges
                .insert((a.to_string(), b.to_string()), "here".into());
        }
        g
    }

    #[test]
    fn a_chain_has_no_cycle_and_a_ring_has_one() {
        assert!(cycles(&graph(&[("api", "store"), ("store", "metrics")])).is_empty());
        let found = cycles(&graph(&[("a", "b"), ("b", "c"), ("c", "a"), ("c", "d")]));
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].first(), found[0].last());
        assert_eq!(found[0].len(), 4);
    }

    #[test]
    fn references_through_crate_super_and_macros_are_found() {
        let dir = std::env::temp_dir().join(format!("modcheck-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("src/a")).unwrap();
        std::fs::write(dir.join("src/lib.rs"), "mod a;\nmod b;\nmod c;\n").unwrap();
        std::fs::write(dir.join("src/a/mod.rs"), "mod inner;\nuse crate::{b::X};\n").unwrap();
        std::fs::write(
            dir.join("src/a/inner.rs"),
            "fn f() { tracing::info!(\"{}\", crate::c::VALUE); }\n",
        )
        .unwrap();
        std::fs::write(
            dir.join("src/b.rs"),
            "use super::a::Y;\n#[cfg(test)]\nmod tests { use crate::c::Z; }\n",
        )
        .unwrap();
        std::fs::write(
            dir.join("src/c.rs"),
            "//! Read by [`a`](crate::a).\npub const VALUE: u8 = 1;\n",
        )
        .unwrap();
        let g = crate_graph(&dir.join("src/lib.rs")).unwrap();
        let edges: Vec<(String, String)> = g.edges.keys().cloned().collect();
        assert_eq!(
            edges,
            [("a", "b"), ("a", "c"), ("b", "a"), ("c", "a")]
                .map(|(x, y)| (x.to_owned(), y.to_owned()))
                .to_vec()
        );
        // a <-> b, and c <-> a through c's doc link.
        assert_eq!(cycles(&g).len(), 2);
        std::fs::remove_dir_all(dir).unwrap();
    }
}
