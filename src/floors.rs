//! The house's floors, and the test that keeps it one-way.
//!
//! Every folder of the library stands on a floor ([`FLOORS`], lowest first, each with why it
//! stands there): a file may use what stands on its own floor (its own folder) or below, never
//! above, and no files use each other round in a circle. A module's use of its parent or an
//! ancestor (`use super::…`) is not counted: a child may use what its parents declare.
//! Everything else is: `use crate::…`, `super::`/`self::` paths, paths through a child module,
//! and `crate::…` paths written inline. Modules only compiled for tests are left out.
//!
//! `cargo test --lib floors` reads the sources of the library, of the relay's binary, of any
//! other binary in `src/bin` and of the benchmark's crate in `bench/` (circles only for those:
//! they have no floors), and fails on an arrow against the floors or on a circle, naming the
//! files and the paths that tie them.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The folders (and top-level files) of the library, lowest floor first.
pub const FLOORS: &[(&str, &str)] = &[
    (
        "clock",
        "the wall clock, read in one place: Unix time for what is compared with PostgreSQL's and Kafka's times",
    ),
    ("lsn", "WAL positions: a value type everything speaks"),
    (
        "config",
        "the TOML file and its validation: plain data, a leaf",
    ),
    (
        "aws",
        "credentials and SigV4 signing, for the RDS and MSK logins",
    ),
    ("postgres", "the control connection, TLS and the RDS login"),
    (
        "source",
        "the walsender connection and the pgoutput decoder",
    ),
    ("mapping", "WAL rows to Kafka records, pure"),
    (
        "sink",
        "the Kafka producer, dead letters, schemas, traces: records out",
    ),
    (
        "serve",
        "metrics and the HTTP endpoints, which show the sink's state",
    ),
    (
        "signals",
        "SIGTERM and SIGINT, from main's first line, to a shutdown token: under the relay and the operator commands, which run until stopped; over the data path, whose stages are handed a token and never look at signals themselves",
    ),
    (
        "relay",
        "the session and its supervisor, wiring source, mapping, sink and serve",
    ),
    (
        "ops",
        "the operator commands, which reuse the relay's parts",
    ),
];

/// One module of a crate: its path (`["sink", "publisher"]`) and its file.
#[derive(Debug, Clone)]
struct Module {
    path: Vec<String>,
    file: PathBuf,
}

/// The modules of the crate rooted at `root` (`src/lib.rs`, `src/main.rs`), following `mod`
/// declarations (and `#[path]`), leaving out those under `#[cfg(test)]`.
fn modules(root: &Path) -> Vec<Module> {
    let mut found = Vec::new();
    let mut todo = vec![Module {
        path: Vec::new(),
        file: root.to_path_buf(),
    }];
    while let Some(module) = todo.pop() {
        let text = std::fs::read_to_string(&module.file).unwrap_or_default();
        let is_dir_owner = matches!(
            module.file.file_name().and_then(|n| n.to_str()),
            Some("mod.rs" | "lib.rs" | "main.rs")
        ) || module.path.is_empty();
        let here = module.file.parent().unwrap_or(Path::new("")).to_path_buf();
        let children_dir = if is_dir_owner {
            here.clone()
        } else {
            here.join(module.file.file_stem().unwrap_or_default())
        };
        let mut attributes: Vec<String> = Vec::new();
        for line in text.lines().map(str::trim) {
            if line.starts_with("#[") {
                attributes.push(line.to_string());
                continue;
            }
            let declared = line
                .strip_prefix("pub mod ")
                .or_else(|| line.strip_prefix("pub(crate) mod "))
                .or_else(|| line.strip_prefix("pub(super) mod "))
                .or_else(|| line.strip_prefix("mod "))
                .and_then(|rest| rest.strip_suffix(';'));
            let test_only = attributes.iter().any(|a| a.starts_with("#[cfg(test"));
            let path_attr = attributes.iter().find_map(|a| {
                a.strip_prefix("#[path = \"")
                    .and_then(|rest| rest.strip_suffix("\"]"))
                    .map(str::to_string)
            });
            if !line.is_empty() && !line.starts_with("//") {
                attributes.clear();
            }
            let (Some(name), false) = (declared, test_only) else {
                continue;
            };
            let file = match path_attr {
                Some(p) => here.join(p),
                None if children_dir.join(format!("{name}.rs")).exists() => {
                    children_dir.join(format!("{name}.rs"))
                }
                None => children_dir.join(name).join("mod.rs"),
            };
            let mut path = module.path.clone();
            path.push(name.to_string());
            todo.push(Module { path, file });
        }
        found.push(module);
    }
    found
}

/// The module paths a file names: every `use` tree expanded, and `crate::` paths inline.
fn named_paths(text: &str) -> Vec<Vec<String>> {
    let code: String = text
        .lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n");
    let mut paths = Vec::new();
    let mut outside_uses = String::new();
    let mut rest = code.as_str();
    while let Some(at) = find_use(rest) {
        let after = &rest[at..];
        let end = after.find(';').unwrap_or(after.len());
        expand(&compact(&after[..end]), &mut Vec::new(), &mut paths);
        outside_uses.push_str(&rest[..at]);
        rest = &after[end..];
    }
    outside_uses.push_str(rest);
    // `crate::a::b` written inline (outside `use`).
    let mut rest = outside_uses.as_str();
    while let Some(at) = rest.find("crate::") {
        let before = rest[..at].chars().last();
        let after = &rest[at + "crate::".len()..];
        if !before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
            let mut path = vec!["crate".to_string()];
            // The path ends at the first segment not followed by `::` (a call's `(`, a space).
            for piece in after.split("::") {
                let segment: String = piece
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect();
                let whole = segment.len() == piece.len();
                if segment.is_empty() {
                    break;
                }
                path.push(segment);
                if !whole {
                    break;
                }
            }
            paths.push(path);
        }
        rest = after;
    }
    paths
}

/// Where the next `use` statement's tree starts (after `use `).
fn find_use(text: &str) -> Option<usize> {
    let mut from = 0;
    while let Some(at) = text[from..].find("use ") {
        let at = from + at;
        let before = text[..at].trim_end_matches([' ', '\t']);
        let starts_statement = before.is_empty()
            || before.ends_with(['\n', ';', '{', '}'])
            || before.ends_with("pub")
            || before.ends_with(')');
        if starts_statement {
            return Some(at + "use ".len());
        }
        from = at + "use ".len();
    }
    None
}

/// A `use` tree on one line, without spaces but those around `as`.
fn compact(tree: &str) -> String {
    let words: Vec<&str> = tree.split_whitespace().collect();
    let mut out = String::new();
    for word in words {
        if word == "as" {
            out.push_str(" as ");
        } else {
            out.push_str(word);
        }
    }
    out
}

/// Expands a compacted `use` tree into its paths.
fn expand(tree: &str, prefix: &mut Vec<String>, out: &mut Vec<Vec<String>>) {
    let tree = tree.trim_start_matches("::");
    match tree.find('{') {
        Some(open) => {
            let head = &tree[..open];
            let depth_before = prefix.len();
            prefix.extend(
                head.split("::")
                    .filter(|s| !s.is_empty())
                    .map(str::to_string),
            );
            let inner = &tree[open + 1..tree.rfind('}').unwrap_or(tree.len())];
            for part in split_top(inner) {
                expand(part, prefix, out);
            }
            prefix.truncate(depth_before);
        }
        _ => {
            let mut path = prefix.clone();
            let plain = tree.split(" as ").next().unwrap_or(tree);
            path.extend(
                plain
                    .split("::")
                    .filter(|s| !s.is_empty())
                    .map(str::to_string),
            );
            out.push(path);
        }
    }
}

/// Splits `a,b::{c,d},e` at its top-level commas.
fn split_top(inner: &str) -> Vec<&str> {
    let (mut parts, mut depth, mut start) = (Vec::new(), 0, 0);
    for (i, c) in inner.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(&inner[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&inner[start..]);
    parts.into_iter().filter(|p| !p.is_empty()).collect()
}

/// An arrow: the file that uses, the file used, and the path that says so.
type Arrow = (PathBuf, PathBuf, String);

/// The arrows between the files of a crate (a module's uses of its ancestors left out).
fn arrows(modules: &[Module]) -> Vec<Arrow> {
    let by_path: BTreeMap<Vec<String>, &Module> =
        modules.iter().map(|m| (m.path.clone(), m)).collect();
    let mut found = BTreeSet::new();
    for module in modules {
        let text = std::fs::read_to_string(&module.file).unwrap_or_default();
        for named in named_paths(&text) {
            let Some(absolute) = absolute(&named, &module.path, &by_path) else {
                continue;
            };
            // The longest module path the named one starts with.
            let target = (1..=absolute.len())
                .rev()
                .find_map(|n| by_path.get(&absolute[..n]))
                .map(|m| (*m).clone());
            let Some(target) = target else { continue };
            let ancestor = module.path.starts_with(&target.path);
            if target.file != module.file && !ancestor {
                found.insert((module.file.clone(), target.file, named.join("::")));
            }
        }
    }
    found.into_iter().collect()
}

/// The named path from the crate root, or `None` for another crate's.
fn absolute(
    named: &[String],
    current: &[String],
    modules: &BTreeMap<Vec<String>, &Module>,
) -> Option<Vec<String>> {
    let (first, rest) = named.split_first()?;
    match first.as_str() {
        "crate" => Some(rest.to_vec()),
        "self" => Some([current, rest].concat()),
        "super" => {
            let mut base = current.to_vec();
            let mut rest = rest;
            base.pop()?;
            while let Some(("super", more)) = rest.split_first().map(|(f, m)| (f.as_str(), m)) {
                base.pop()?;
                rest = more;
            }
            Some([base.as_slice(), rest].concat())
        }
        child => {
            let mut path = current.to_vec();
            path.push(child.to_string());
            modules
                .contains_key(&path)
                .then(|| [current, named].concat())
        }
    }
}

/// The circles among `arrows`: each strongly connected set of more than one file.
fn circles(arrows: &[Arrow]) -> Vec<Vec<PathBuf>> {
    let mut next: BTreeMap<&PathBuf, Vec<&PathBuf>> = BTreeMap::new();
    for (from, to, _) in arrows {
        next.entry(from).or_default().push(to);
        next.entry(to).or_default();
    }
    let reach = |start: &PathBuf| {
        let mut seen = BTreeSet::new();
        let mut todo = vec![start];
        while let Some(at) = todo.pop() {
            for n in next.get(at).into_iter().flatten() {
                if seen.insert(*n) {
                    todo.push(n);
                }
            }
        }
        seen
    };
    let reachable: BTreeMap<&PathBuf, BTreeSet<&PathBuf>> =
        next.keys().map(|f| (*f, reach(f))).collect();
    let mut circles: BTreeSet<Vec<PathBuf>> = BTreeSet::new();
    for (file, from_it) in &reachable {
        let mut circle: Vec<PathBuf> = from_it
            .iter()
            .filter(|other| reachable[*other].contains(file))
            .map(|f| (*f).clone())
            .collect();
        if circle.len() > 1 {
            circle.sort();
            circles.insert(circle);
        }
    }
    circles.into_iter().collect()
}

/// The floor of a library file: of its folder (or top-level file) under `src`.
fn floor_of(src: &Path, file: &Path) -> Option<usize> {
    let first = file.strip_prefix(src).ok()?.components().next()?;
    let name = first.as_os_str().to_str()?.trim_end_matches(".rs");
    FLOORS.iter().position(|(folder, _)| *folder == name)
}

#[cfg(test)]
mod tests;
