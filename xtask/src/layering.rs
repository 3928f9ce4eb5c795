//! `cargo xtask layering`: the one-way flow the crate and module layout promises,
//! checked — so that a lower layer importing a higher one fails a test run, not a review.
//!
//! Three rules, each read from the source and `cargo metadata`, never from a list kept
//! by hand beside the code:
//! 1. **Crates**: `prima-abi`, `prima-host` ← `prima-core` ← `prima-cluster` ←
//!    `prima-server` ← `prima-cli`; a crate depends (normal dependencies) only on crates
//!    of lower layers. A plugin's whole normal dependency tree holds none of the engine's
//!    crates: plugins build against `prima-abi` and `prima-host` alone.
//! 2. **Modules**: inside each of those crates, the top-level modules are layered
//!    ([`MODULE_LAYERS`]); a module names (`crate::x`, `super::x`) only modules of lower
//!    layers. A new top-level module must be given its layer here.
//! 3. **No circles**: at every folder of every crate, plugins included, sibling modules
//!    never import each other round a circle.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};

use crate::layout::Layout;

/// The engine's crates, bottom-up: a crate may depend only on crates of lower layers.
const CRATE_LAYERS: &[(&str, u32)] = &[
    ("prima-abi", 0),
    ("prima-host", 0),
    ("prima-core", 1),
    ("prima-cluster", 2),
    ("prima-server", 3),
    ("prima-cli", 4),
];

/// Each crate's top-level modules, bottom-up: a module imports only those of layers
/// below its own (modules of one layer never import each other).
const MODULE_LAYERS: &[(&str, &[&[&str]])] = &[
    (
        "prima-core/src",
        &[
            &["gguf", "sampler", "chat", "plugin"],
            &["tokenizer"],
            &["model"],
            &["batch", "generate"],
            &["speculative", "perplexity"],
        ],
    ),
    (
        "prima-cluster/src",
        &[
            &["profile"],
            &["halda", "prp"],
            &["discovery"],
            &["manifest"],
            &["controller"],
        ],
    ),
    (
        "prima-server/src",
        &[
            &["job", "stop", "one_slot", "harmony", "board"],
            &["metrics", "openai"],
            &["queue"],
            &["slot"],
            &["scheduler"],
            &["speculative", "worker"],
            &["web"],
            &["http", "fuzzing"],
        ],
    ),
    // The binary: the hub client (I/O at the edge) below the commands that use it.
    ("prima-cli/src", &[&["hub"], &["cli"]]),
];

/// Where rule 3 looks: every source folder of the workspace's own crates.
const SOURCE_ROOTS: &[&str] = &[
    "prima-abi/src",
    "prima-host/src",
    "prima-core/src",
    "prima-cluster/src",
    "prima-server/src",
    "prima-cli/src",
    "plugins",
    "xtask/src",
];

pub fn run(layout: &Layout) -> Result<()> {
    let mut faults = Vec::new();
    faults.extend(crate_faults(&layout.workspace)?);
    for (root, layers) in MODULE_LAYERS {
        faults.extend(module_layer_faults(&layout.workspace.join(root), layers)?);
    }
    for root in SOURCE_ROOTS {
        for src in source_dirs(&layout.workspace.join(root)) {
            faults.extend(circle_faults(&layout.workspace, &src)?);
        }
    }
    if !faults.is_empty() {
        for f in &faults {
            eprintln!("layering: {f}");
        }
        bail!("{} layering fault(s)", faults.len());
    }
    println!("layering: crates, modules and circles all one-way");
    Ok(())
}

/// Rule 1, from `cargo metadata`'s resolved graph (normal dependencies only).
fn crate_faults(workspace: &Path) -> Result<Vec<String>> {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let out = Command::new(&cargo)
        .args(["metadata", "--format-version", "1"])
        .current_dir(workspace)
        .output()
        .context("cannot run cargo metadata")?;
    if !out.status.success() {
        bail!("cargo metadata: {}", String::from_utf8_lossy(&out.stderr));
    }
    let meta: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    let name_of: BTreeMap<String, String> = meta["packages"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|p| {
            (
                p["id"].as_str().unwrap_or_default().to_string(),
                p["name"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect();
    let mut normal_deps: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for node in meta["resolve"]["nodes"].as_array().into_iter().flatten() {
        let id = node["id"].as_str().unwrap_or_default();
        let deps = node["deps"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|d| {
                d["dep_kinds"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .any(|k| k["kind"].is_null())
            })
            .filter_map(|d| name_of.get(d["pkg"].as_str().unwrap_or_default()).cloned())
            .collect();
        if let Some(name) = name_of.get(id) {
            normal_deps.insert(name.clone(), deps);
        }
    }
    // A plugin's tree is resolved for the plugin alone (`cargo tree`): the workspace-wide
    // graph unifies the features that test-only dependents turn on.
    let mut plugin_trees = BTreeMap::new();
    for plugin in plugin_names(&meta, workspace) {
        let out = Command::new(&cargo)
            .args(["tree", "-p", &plugin, "-e", "normal", "--prefix", "none"])
            .current_dir(workspace)
            .output()
            .with_context(|| format!("cannot run cargo tree -p {plugin}"))?;
        if !out.status.success() {
            bail!(
                "cargo tree -p {plugin}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        let tree: BTreeSet<String> = String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| l.split(' ').next())
            .filter(|n| *n != plugin)
            .map(str::to_string)
            .collect();
        plugin_trees.insert(plugin, tree);
    }
    Ok(check_crates(&normal_deps, &plugin_trees))
}

/// The workspace members under `plugins/`.
fn plugin_names(meta: &serde_json::Value, workspace: &Path) -> Vec<String> {
    let plugins = workspace.join("plugins");
    meta["packages"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|p| {
            Path::new(p["manifest_path"].as_str().unwrap_or_default()).starts_with(&plugins)
        })
        .filter_map(|p| p["name"].as_str().map(str::to_string))
        .collect()
}

/// Rule 1 over a dependency map (package → its normal dependencies) and each plugin's
/// whole normal dependency tree.
fn check_crates(
    normal_deps: &BTreeMap<String, Vec<String>>,
    plugin_trees: &BTreeMap<String, BTreeSet<String>>,
) -> Vec<String> {
    let layer = |name: &str| CRATE_LAYERS.iter().find(|(n, _)| *n == name).map(|l| l.1);
    let mut faults = Vec::new();
    for (name, own) in CRATE_LAYERS {
        for dep in normal_deps.get(*name).into_iter().flatten() {
            if let Some(theirs) = layer(dep) {
                if theirs >= *own {
                    faults.push(format!(
                        "crate {name} (layer {own}) depends on {dep} (layer {theirs}): only lower layers"
                    ));
                }
            }
        }
    }
    for (plugin, tree) in plugin_trees {
        for engine in tree.iter().filter(|d| layer(d).is_some_and(|l| l >= 1)) {
            faults.push(format!(
                "plugin {plugin} depends on {engine}: plugins build against prima-abi and prima-host only"
            ));
        }
    }
    faults
}

/// Rule 2 for one crate's `src`.
fn module_layer_faults(src: &Path, layers: &[&[&str]]) -> Result<Vec<String>> {
    let graph = module_graph(src, &[])?;
    let layer_of = |m: &str| layers.iter().position(|l| l.contains(&m));
    let mut faults = Vec::new();
    for (module, imports) in &graph {
        let Some(own) = layer_of(module) else {
            faults.push(format!(
                "{}: module `{module}` has no layer in xtask/src/layering.rs (MODULE_LAYERS)",
                src.display()
            ));
            continue;
        };
        for (import, file) in imports {
            match layer_of(import) {
                Some(theirs) if theirs < own => {}
                _ => faults.push(format!(
                    "{}: `{module}` imports `{import}` (a module of its own or a higher layer)",
                    file.display()
                )),
            }
        }
    }
    Ok(faults)
}

/// Rule 3 for the sibling modules of one folder (`src` or a module folder under it).
fn circle_faults(workspace: &Path, dir: &Path) -> Result<Vec<String>> {
    let (root, level) = crate_root_and_level(dir);
    let graph = module_graph(&root, &level)?;
    let edges: BTreeMap<&str, Vec<&str>> = graph
        .iter()
        .map(|(m, imports)| (m.as_str(), imports.keys().map(String::as_str).collect()))
        .collect();
    Ok(circles(&edges)
        .into_iter()
        .map(|c| {
            let shown = dir.strip_prefix(workspace).unwrap_or(dir);
            format!("{}: import circle {}", shown.display(), c.join(" → "))
        })
        .collect())
}

/// The crate's `src` above `dir` and the module path of `dir` inside it.
fn crate_root_and_level(dir: &Path) -> (PathBuf, Vec<String>) {
    let mut root = dir.to_path_buf();
    let mut level = Vec::new();
    while root.file_name().is_some_and(|n| n != "src") {
        if let Some(n) = root.file_name() {
            level.insert(0, n.to_string_lossy().into_owned());
        }
        if !root.pop() {
            break;
        }
    }
    (root, level)
}

/// Every folder holding Rust sources under `root` that is a crate's `src` or a module
/// folder under one.
fn source_dirs(root: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        let mut has_rs = false;
        for e in entries.flatten() {
            let p = e.path();
            if p.is_dir() && p.file_name().is_some_and(|n| n != "target" && n != "tests") {
                stack.push(p);
            } else if p.extension().is_some_and(|x| x == "rs") {
                has_rs = true;
            }
        }
        let in_src = dir.components().any(|c| c.as_os_str() == "src");
        if has_rs && in_src {
            out.push(dir);
        }
    }
    out.sort();
    out
}

/// Module → (imported sibling → a file that imports it), for the children of the module
/// at `level` under the crate root `src`.
type ModuleGraph = BTreeMap<String, BTreeMap<String, PathBuf>>;

fn module_graph(src: &Path, level: &[String]) -> Result<ModuleGraph> {
    let mut files = Vec::new();
    collect_rs(src, &mut files);
    let mut graph: ModuleGraph = BTreeMap::new();
    for file in &files {
        let path = module_path(src, file);
        if path.len() > level.len() && path[..level.len()] == *level {
            graph.entry(path[level.len()].clone()).or_default();
        }
    }
    for file in &files {
        let path = module_path(src, file);
        if !(path.len() > level.len() && path[..level.len()] == *level) {
            continue;
        }
        let own = &path[level.len()];
        let text = std::fs::read_to_string(file)
            .with_context(|| format!("cannot read {}", file.display()))?;
        for target in references(&path, &text) {
            if target.len() > level.len() && target[..level.len()] == *level {
                let other = &target[level.len()];
                if other != own && graph.contains_key(other) {
                    graph.get_mut(own).into_iter().for_each(|m| {
                        m.entry(other.clone()).or_insert_with(|| file.clone());
                    });
                }
            }
        }
    }
    Ok(graph)
}

fn collect_rs(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let p = e.path();
        if p.is_dir() {
            collect_rs(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// `src/a/b.rs` → `[a, b]`; `src/a/mod.rs` → `[a]`; `src/lib.rs` → `[]`.
fn module_path(src: &Path, file: &Path) -> Vec<String> {
    let rel = file.strip_prefix(src).unwrap_or(file).with_extension("");
    let mut parts: Vec<String> = rel
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    if parts
        .last()
        .is_some_and(|l| l == "mod" || l == "lib" || l == "main")
    {
        parts.pop();
    }
    parts
}

/// The module paths a file names through `crate::`, `self::` and `super::` (comment lines
/// skipped; `a::{b, c}` groups give each name).
fn references(file_module: &[String], text: &str) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    for line in text.lines() {
        let code = line.trim_start();
        if code.starts_with("//") {
            continue;
        }
        let code = code.split(" //").next().unwrap_or(code);
        let bytes = code.as_bytes();
        let mut i = 0;
        while i < code.len() {
            let rest = &code[i..];
            let at_word_start = i == 0
                || !(bytes[i - 1].is_ascii_alphanumeric()
                    || bytes[i - 1] == b'_'
                    || bytes[i - 1] == b'$');
            let head = ["crate::", "self::", "super::"]
                .into_iter()
                .find(|h| rest.starts_with(h));
            let (Some(head), true) = (head, at_word_start) else {
                i += rest.chars().next().map_or(1, char::len_utf8);
                continue;
            };
            let mut base: Vec<String> = match head {
                "crate::" => Vec::new(),
                _ => file_module.to_vec(),
            };
            let mut j = i + head.len();
            if head == "super::" {
                base.pop();
            }
            while code[j..].starts_with("super::") {
                base.pop();
                j += "super::".len();
            }
            let tail = &code[j..];
            if let Some(group) = tail.strip_prefix('{') {
                let inner = group.split('}').next().unwrap_or_default();
                for name in inner.split(',') {
                    let name = name.trim().split("::").next().unwrap_or_default().trim();
                    if is_ident(name) {
                        let mut p = base.clone();
                        p.push(name.to_string());
                        out.push(p);
                    }
                }
            } else {
                let name: String = tail
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect();
                if is_ident(&name) {
                    let mut p = base.clone();
                    p.push(name);
                    out.push(p);
                }
            }
            i = j;
        }
    }
    out
}

fn is_ident(s: &str) -> bool {
    !s.is_empty() && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// The strongly connected components of more than one module (Tarjan), each sorted.
fn circles(edges: &BTreeMap<&str, Vec<&str>>) -> Vec<Vec<String>> {
    struct State<'a> {
        edges: &'a BTreeMap<&'a str, Vec<&'a str>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on_stack: BTreeSet<&'a str>,
        next: usize,
        found: Vec<Vec<String>>,
    }
    fn visit<'a>(s: &mut State<'a>, v: &'a str) {
        s.index.insert(v, s.next);
        s.low.insert(v, s.next);
        s.next += 1;
        s.stack.push(v);
        s.on_stack.insert(v);
        for &w in s.edges.get(v).into_iter().flatten() {
            if !s.index.contains_key(w) {
                visit(s, w);
                let lw = s.low[w];
                let lv = s.low.get_mut(v).expect("visited");
                *lv = (*lv).min(lw);
            } else if s.on_stack.contains(w) {
                let iw = s.index[w];
                let lv = s.low.get_mut(v).expect("visited");
                *lv = (*lv).min(iw);
            }
        }
        if s.low[v] == s.index[v] {
            let mut component = Vec::new();
            while let Some(w) = s.stack.pop() {
                s.on_stack.remove(w);
                component.push(w.to_string());
                if w == v {
                    break;
                }
            }
            if component.len() > 1 {
                component.sort();
                s.found.push(component);
            }
        }
    }
    let mut s = State {
        edges,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        next: 0,
        found: Vec::new(),
    };
    for &v in edges.keys() {
        if !s.index.contains_key(v) {
            visit(&mut s, v);
        }
    }
    s.found
}

#[cfg(test)]
mod tests {
    use super::*;

    fn path(parts: &[&str]) -> Vec<String> {
        parts.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn references_resolve_crate_self_super_and_groups() {
        let text = "use crate::gguf::GgufFile;\nuse super::{slot, stop::Stop};\n// crate::ignored\nlet x = super::super::top::f();\n";
        let refs = references(&path(&["server", "worker"]), text);
        assert!(refs.contains(&path(&["gguf", "GgufFile"])) || refs.contains(&path(&["gguf"])));
        assert!(refs.contains(&path(&["server", "slot"])));
        assert!(refs.contains(&path(&["server", "stop"])));
        assert!(refs.contains(&path(&["top"])));
        assert!(!refs.iter().any(|r| r.contains(&"ignored".to_string())));
    }

    #[test]
    fn a_circle_is_found_and_a_chain_is_not() {
        let mut edges = BTreeMap::new();
        edges.insert("a", vec!["b"]);
        edges.insert("b", vec!["c"]);
        edges.insert("c", vec!["a"]);
        edges.insert("d", vec!["a"]);
        assert_eq!(circles(&edges), vec![path(&["a", "b", "c"])]);
        edges.insert("c", vec![]);
        assert!(circles(&edges).is_empty());
    }

    #[test]
    fn a_plugin_that_reaches_the_engine_is_a_fault() {
        let mut deps = BTreeMap::new();
        deps.insert("prima-core".to_string(), vec!["prima-abi".to_string()]);
        let tree: BTreeSet<String> = ["prima-gpu-x", "prima-core", "prima-abi"]
            .map(String::from)
            .into();
        let trees = BTreeMap::from([("prima-backend-x".to_string(), tree)]);
        let faults = check_crates(&deps, &trees);
        assert!(
            faults
                .iter()
                .any(|f| f.contains("prima-backend-x depends on prima-core")),
            "{faults:?}"
        );
        deps.insert("prima-abi".to_string(), vec!["prima-core".to_string()]);
        let faults = check_crates(&deps, &BTreeMap::new());
        assert!(
            faults
                .iter()
                .any(|f| f.contains("crate prima-abi (layer 0) depends on prima-core")),
            "{faults:?}"
        );
    }

    /// The real tree obeys every rule (the same check `cargo xtask test` runs first).
    #[test]
    fn the_workspace_is_layered() {
        let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
        let mut faults = Vec::new();
        for (root, layers) in MODULE_LAYERS {
            faults.extend(module_layer_faults(&workspace.join(root), layers).unwrap());
        }
        for root in SOURCE_ROOTS {
            for src in source_dirs(&workspace.join(root)) {
                faults.extend(circle_faults(workspace, &src).unwrap());
            }
        }
        assert!(faults.is_empty(), "{}", faults.join("\n"));
    }
}
