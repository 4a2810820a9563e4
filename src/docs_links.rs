//! The docs' links, and the test that keeps them holding.
//!
//! A reader who follows a link and lands on nothing stops trusting the docs; an operator whose
//! error message names a section that was renamed is stuck at the worst moment. So this test
//! reads, without any service, the markdown of `README.md`, `DEVELOPMENT.md` and `docs/` (the
//! book), and fails when a link:
//!
//! - names a file or folder that does not exist (relative to the page, as GitHub and mdBook
//!   resolve it), or
//! - names an `#anchor` that is not a heading of its page (GitHub's slug: lower case,
//!   punctuation dropped, spaces to `-`, `-1`, `-2` … for repeated headings; mdBook makes the
//!   same ids from the same headings), or
//! - in a page of the book (`docs/src/`), leaves the book or names a folder: `mdbook build`
//!   outputs only `docs/src/` (each `.md` as `.html`, other files copied), so a relative link
//!   to `DEVELOPMENT.md`, `deploy/` or `examples/` is dead in the built book although it works
//!   on GitHub. Such files are named as repository paths in code (`` `deploy/…` ``) instead.
//!
//! It also reads what the code and the operator files (`src/`, `tests/`, `examples/`,
//! `config/`, `deploy/`, `migrations/`, `scripts/`, `bench/README.md`) say to a reader: every
//! `docs/….md#anchor` they name (error hints, runbook URLs, comments) must exist, and so must
//! every README section they name in words (`README "Routing"`, `the README (High availability)`).
//!
//! Nothing is skipped: a link to a page another change is still writing counts as broken until
//! that page is committed. External links (`https:`, `mailto:`) are not fetched.
//!
//! `cargo test --lib docs_links` runs it.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Component, Path, PathBuf};

use regex::Regex;

/// The repository's root: where `Cargo.toml` is.
fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Every file under `dir` whose name ends with one of `suffixes` (all files for an empty list),
/// leaving out `target/` and hidden folders.
fn files_under(dir: &Path, suffixes: &[&str]) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(here) = todo.pop() {
        let Ok(entries) = std::fs::read_dir(&here) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.starts_with('.') || name == "target" {
                continue;
            }
            if path.is_dir() {
                todo.push(path);
            } else if suffixes.is_empty() || suffixes.iter().any(|s| name.ends_with(s)) {
                found.push(path);
            }
        }
    }
    found.sort();
    found
}

/// The markdown the test reads: the README, DEVELOPMENT.md and the book.
fn markdown_files(root: &Path) -> Vec<PathBuf> {
    let mut files = vec![root.join("README.md"), root.join("DEVELOPMENT.md")];
    files.extend(files_under(&root.join("docs"), &[".md"]));
    files
}

/// The lines of `text` outside fenced code blocks, with their 1-based numbers.
fn prose_lines(text: &str) -> Vec<(usize, &str)> {
    let mut fence: Option<&str> = None;
    let mut lines = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let trimmed = line.trim_start();
        let marker = ["```", "~~~"].into_iter().find(|m| trimmed.starts_with(m));
        match (fence, marker) {
            (None, Some(m)) => fence = Some(m),
            (Some(open), Some(m))
                if open == m && trimmed.trim_end().trim_start_matches(m).is_empty() =>
            {
                fence = None
            }
            (None, None) => lines.push((i + 1, line)),
            _ => {}
        }
    }
    lines
}

/// GitHub's anchor for a heading's text: markdown links reduced to their text, lower case,
/// everything but letters, digits, spaces, `-` and `_` dropped, spaces to `-`.
fn slug(heading: &str) -> String {
    let link = Regex::new(r"\[([^\]]*)\]\([^)]*\)").expect("a valid pattern");
    let text = link.replace_all(heading.trim(), "$1");
    text.to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || matches!(c, ' ' | '-' | '_'))
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// The anchors of a markdown page: its headings' slugs (repeated ones numbered as GitHub does)
/// and any explicit `id="…"` / `name="…"` in HTML.
fn anchors(text: &str) -> BTreeSet<String> {
    let heading = Regex::new(r"^#{1,6}\s+(.*?)\s*#*\s*$").expect("a valid pattern");
    let html = Regex::new(r#"(?:id|name)="([^"]+)""#).expect("a valid pattern");
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut found = BTreeSet::new();
    for (_, line) in prose_lines(text) {
        if let Some(caps) = heading.captures(line) {
            let base = slug(&caps[1]);
            let n = seen.entry(base.clone()).or_insert(0);
            found.insert(if *n == 0 {
                base.clone()
            } else {
                format!("{base}-{n}")
            });
            *n += 1;
        }
        for caps in html.captures_iter(line) {
            found.insert(caps[1].to_string());
        }
    }
    found
}

/// One link found in a page.
#[derive(Debug)]
struct Link {
    line: usize,
    target: String,
}

/// The link targets of a markdown page, outside code blocks and code spans: inline links and
/// images (`[text](target "title")`) and reference definitions (`[label]: target`).
fn links(text: &str) -> Vec<Link> {
    let definition = Regex::new(r"^\s{0,3}\[[^\]]+\]:\s+(\S+)").expect("a valid pattern");
    let mut found = Vec::new();
    for (number, line) in prose_lines(text) {
        if let Some(caps) = definition.captures(line) {
            found.push(Link {
                line: number,
                target: caps[1].trim_matches(|c| c == '<' || c == '>').to_string(),
            });
            continue;
        }
        let code = without_code_spans(line);
        let mut rest = code.as_str();
        while let Some(at) = rest.find("](") {
            let after = &rest[at + 2..];
            // The target runs to the `)` that balances the `(`.
            let mut depth = 0usize;
            let mut end = after.len();
            for (i, c) in after.char_indices() {
                match c {
                    '(' => depth += 1,
                    ')' if depth == 0 => {
                        end = i;
                        break;
                    }
                    ')' => depth -= 1,
                    _ => {}
                }
            }
            let inside = after[..end].trim();
            let target = inside.split_whitespace().next().unwrap_or("");
            found.push(Link {
                line: number,
                target: target.trim_matches(|c| c == '<' || c == '>').to_string(),
            });
            rest = &after[end.min(after.len())..];
        }
    }
    found
}

/// `line` with each code span's content blanked out (the backticks stay), so that brackets
/// and parentheses inside code are not read as links. An unmatched run of backticks is text.
fn without_code_spans(line: &str) -> String {
    let chars: Vec<char> = line.chars().collect();
    let mut out = String::with_capacity(line.len());
    let mut i = 0;
    while i < chars.len() {
        if chars[i] != '`' {
            out.push(chars[i]);
            i += 1;
            continue;
        }
        let run = chars[i..].iter().take_while(|&&c| c == '`').count();
        // The closing run: the next run of exactly the same length.
        let mut j = i + run;
        let mut close = None;
        while j < chars.len() {
            if chars[j] == '`' {
                let other = chars[j..].iter().take_while(|&&c| c == '`').count();
                if other == run {
                    close = Some(j);
                    break;
                }
                j += other;
            } else {
                j += 1;
            }
        }
        match close {
            Some(j) => {
                out.extend(std::iter::repeat_n('`', run));
                out.extend(std::iter::repeat_n(' ', j - i - run));
                out.extend(std::iter::repeat_n('`', run));
                i = j + run;
            }
            None => {
                out.extend(std::iter::repeat_n('`', run));
                i += run;
            }
        }
    }
    out
}

/// `path` with `.` and `..` resolved without touching the file system.
fn normalize(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for part in path.components() {
        match part {
            Component::ParentDir => {
                out.pop();
            }
            Component::CurDir => {}
            other => out.push(other),
        }
    }
    out
}

/// Why `target`, written in `from` (a file, or the root for hints), does not hold; `None`
/// when it does. `cache` keeps each page's anchors.
fn broken(
    root: &Path,
    from: &Path,
    target: &str,
    cache: &mut BTreeMap<PathBuf, BTreeSet<String>>,
) -> Option<String> {
    if target.is_empty() {
        return Some("an empty link".to_string());
    }
    if target.contains("://") || target.starts_with("mailto:") {
        return None;
    }
    let (path, anchor) = match target.split_once('#') {
        Some((path, anchor)) => (path, Some(anchor)),
        None => (target, None),
    };
    let file = if path.is_empty() {
        from.to_path_buf()
    } else {
        let base = if from.is_dir() {
            from
        } else {
            from.parent().unwrap_or(root)
        };
        normalize(&base.join(path.replace("%20", " ")))
    };
    if !file.starts_with(root) {
        return Some("points outside the repository".to_string());
    }
    if !file.exists() {
        return Some(format!(
            "{} does not exist",
            file.strip_prefix(root).unwrap_or(&file).display()
        ));
    }
    let anchor = anchor?;
    let is_markdown = file.extension().is_some_and(|e| e == "md");
    if !is_markdown {
        // GitHub's line anchors into a source file.
        let line = Regex::new(r"^L\d+(-L\d+)?$").expect("a valid pattern");
        return (!line.is_match(anchor))
            .then(|| format!("#{anchor}: only a markdown page has section anchors"));
    }
    let known = cache
        .entry(file.clone())
        .or_insert_with(|| anchors(&std::fs::read_to_string(&file).unwrap_or_default()));
    (!known.contains(anchor)).then(|| {
        format!(
            "#{anchor} is not a heading of {}",
            file.strip_prefix(root).unwrap_or(&file).display()
        )
    })
}

/// Why `target`, written in the book's page `from`, is dead in `mdbook build`'s output although
/// the file exists: it leaves `book` (the book's `src`), even only on its way (`../../x/…`), or
/// names a folder (the built book has a page per `.md`, no folder listings). `None` when it
/// stays in the book, or is external or an anchor of the page itself.
fn leaves_book(book: &Path, from: &Path, target: &str) -> Option<String> {
    if target.contains("://") || target.starts_with("mailto:") || target.starts_with('#') {
        return None;
    }
    let path = target.split('#').next().unwrap_or("");
    let mut depth = from
        .parent()
        .and_then(|dir| dir.strip_prefix(book).ok())
        .map_or(0, |dir| dir.components().count());
    for part in Path::new(path).components() {
        match part {
            Component::ParentDir if depth == 0 => {
                return Some(
                    "leaves the book: `mdbook build` outputs docs/src/ only, so the link is dead \
                     there; link a page of the book, or name the file as a repository path in \
                     code (`deploy/…`) without a link"
                        .to_string(),
                );
            }
            Component::ParentDir => depth -= 1,
            Component::Normal(_) => depth += 1,
            _ => {}
        }
    }
    let file = normalize(&from.parent().unwrap_or(book).join(path));
    (file.is_dir()).then(|| {
        "names a folder: the built book has no page for it; link a page of the book".to_string()
    })
}

/// Every broken link of the markdown files, as `file:line: target: why`.
fn broken_markdown_links(root: &Path) -> Vec<String> {
    let book = root.join("docs/src");
    let mut cache = BTreeMap::new();
    let mut problems = Vec::new();
    for file in markdown_files(root) {
        let Ok(text) = std::fs::read_to_string(&file) else {
            problems.push(format!("{}: cannot be read", file.display()));
            continue;
        };
        let in_book = file.starts_with(&book);
        for link in links(&text) {
            let why = broken(root, &file, &link.target, &mut cache).or_else(|| {
                in_book
                    .then(|| leaves_book(&book, &file, &link.target))
                    .flatten()
            });
            if let Some(why) = why {
                problems.push(format!(
                    "{}:{}: ({}): {why}",
                    file.strip_prefix(root).unwrap_or(&file).display(),
                    link.line,
                    link.target
                ));
            }
        }
    }
    problems
}

/// Every docs section the code and the operator files name that does not exist.
fn broken_hints(root: &Path) -> Vec<String> {
    // `docs/….md` with an optional anchor, as hints and runbook URLs write it; not a path that
    // merely ends in docs/ (`../shared/docs/x.md` lies outside the repository).
    let docs_path =
        Regex::new(r"(?:^|[^A-Za-z0-9_./-])(docs/[A-Za-z0-9_./-]*\.md(?:#[A-Za-z0-9_-]+)?)")
            .expect("a valid pattern");
    // A README section named in words: README "Routing", README, "Kafka", README: "Kafka",
    // the README (High availability), "Routing" in the README.
    let readme_section =
        Regex::new(r#"README[,:]? (?:"([^"]+)"|\(([^)]+)\))|"([^"]+)" in the README"#)
            .expect("a valid pattern");
    let readme_anchors =
        anchors(&std::fs::read_to_string(root.join("README.md")).unwrap_or_default());
    let mut files = Vec::new();
    for dir in [
        "src",
        "tests",
        "examples",
        "config",
        "deploy",
        "migrations",
        "scripts",
    ] {
        files.extend(files_under(&root.join(dir), &[]));
    }
    files.extend(
        [
            "Dockerfile",
            "docker-compose.yml",
            "Cargo.toml",
            "bench/README.md",
        ]
        .map(|f| root.join(f)),
    );
    let mut cache = BTreeMap::new();
    let mut problems = Vec::new();
    for file in files {
        if file.ends_with("src/docs_links.rs") {
            continue; // its own examples of what it looks for
        }
        let Ok(text) = std::fs::read_to_string(&file) else {
            continue; // binary or absent
        };
        let shown = file
            .strip_prefix(root)
            .unwrap_or(&file)
            .display()
            .to_string();
        for (i, line) in text.lines().enumerate() {
            for caps in docs_path.captures_iter(line) {
                let found = &caps[1];
                if let Some(why) = broken(root, root, found, &mut cache) {
                    problems.push(format!("{shown}:{}: {found}: {why}", i + 1));
                }
            }
            for caps in readme_section.captures_iter(line) {
                let section = (1..=3).find_map(|i| caps.get(i)).map_or("", |m| m.as_str());
                if !readme_anchors.contains(&slug(section)) {
                    problems.push(format!(
                        "{shown}:{}: names the README section \"{section}\", which README.md does not have: name its page under docs/ instead",
                        i + 1
                    ));
                }
            }
        }
    }
    problems
}

#[test]
fn every_markdown_link_points_to_a_file_and_heading_that_exist() {
    let problems = broken_markdown_links(&root());
    assert!(
        problems.is_empty(),
        "{} broken link(s) in README.md, DEVELOPMENT.md and docs/ (paths are relative to the page; \
         anchors are GitHub heading slugs; a page of the book may not leave docs/src):\n  {}",
        problems.len(),
        problems.join("\n  ")
    );
}

#[test]
fn every_docs_section_the_code_names_exists() {
    let problems = broken_hints(&root());
    assert!(
        problems.is_empty(),
        "{} reference(s) from the code and operator files to docs sections that do not exist:\n  {}",
        problems.len(),
        problems.join("\n  ")
    );
}

#[test]
fn every_book_page_is_in_the_summary() {
    let src = root().join("docs/src");
    let summary = std::fs::read_to_string(src.join("SUMMARY.md")).unwrap_or_default();
    let listed: BTreeSet<PathBuf> = links(&summary)
        .into_iter()
        .map(|l| normalize(&src.join(l.target.split('#').next().unwrap_or(""))))
        .collect();
    let orphans: Vec<String> = files_under(&src, &[".md"])
        .into_iter()
        .filter(|f| !f.ends_with("SUMMARY.md") && !listed.contains(f))
        .map(|f| f.strip_prefix(&src).unwrap_or(&f).display().to_string())
        .collect();
    assert!(
        orphans.is_empty(),
        "{} page(s) of docs/src that docs/src/SUMMARY.md does not list (mdBook would not build them): {}",
        orphans.len(),
        orphans.join(", ")
    );
}

#[test]
fn slugs_follow_github() {
    assert_eq!(
        slug("Dead letters: list, redrive, breaker"),
        "dead-letters-list-redrive-breaker"
    );
    assert_eq!(
        slug("OAuth (SASL OAUTHBEARER with OIDC client credentials)"),
        "oauth-sasl-oauthbearer-with-oidc-client-credentials"
    );
    assert_eq!(slug("`outbox-relay status`"), "outbox-relay-status");
    assert_eq!(
        slug("Failover slots (PostgreSQL 17+)"),
        "failover-slots-postgresql-17"
    );
    assert_eq!(slug("See [the guide](x.md) now"), "see-the-guide-now");
}

#[test]
fn repeated_headings_are_numbered_and_code_blocks_are_not_headings() {
    let page = "# A\n## Same\n```sh\n# not a heading\n```\n## Same\n";
    let found = anchors(page);
    assert_eq!(
        found,
        ["a", "same", "same-1"]
            .map(String::from)
            .into_iter()
            .collect()
    );
}

#[test]
fn links_inside_code_are_not_links() {
    let page =
        "See [`[kafka.x]`](#kafka) and `a](b)` and\n```\n[x](nowhere.md)\n```\n[d]: other.md\n";
    let targets: Vec<String> = links(page).into_iter().map(|l| l.target).collect();
    assert_eq!(targets, ["#kafka", "other.md"]);
}

#[test]
fn a_book_page_may_not_leave_the_book() {
    let root = root();
    let book = root.join("docs/src");
    let page = book.join("guides/managed/aws.md");
    let leaves = |target: &str| leaves_book(&book, &page, target).is_some();
    assert!(leaves("../../../../config/managed/rds-iam-msk-scram.toml"));
    assert!(leaves("../../../../DEVELOPMENT.md#benchmark"));
    // Back into the book, but through a folder the built book does not have.
    assert!(leaves("../../../../docs/src/operations/runbooks.md"));
    assert!(leaves("../../guides/"));
    assert!(!leaves("../../operations/runbooks.md#sweeper-hold"));
    assert!(!leaves("index.md"));
    assert!(!leaves("#amazon-msk"));
    assert!(!leaves("https://docs.aws.amazon.com/"));
}

/// The `###` sections of a page that its index, the links before its first `##` heading, does
/// not name.
fn missing_from_index(text: &str) -> Vec<String> {
    let prose = prose_lines(text);
    let first_section = prose
        .iter()
        .position(|(_, line)| line.starts_with("## "))
        .unwrap_or(prose.len());
    let head: String = prose[..first_section]
        .iter()
        .map(|(_, line)| *line)
        .collect::<Vec<_>>()
        .join("\n");
    let indexed: BTreeSet<String> = links(&head)
        .into_iter()
        .filter_map(|l| l.target.strip_prefix('#').map(str::to_string))
        .collect();
    let sections = anchors(
        &prose
            .iter()
            .filter(|(_, line)| line.starts_with("### "))
            .map(|(_, line)| *line)
            .collect::<Vec<_>>()
            .join("\n"),
    );
    sections.difference(&indexed).cloned().collect()
}

/// The runbook pages, each with an index at its top that must name every one of its sections.
const RUNBOOK_PAGES: &[&str] = &[
    "docs/src/operations/alerts.md",
    "docs/src/operations/runbooks.md",
];

#[test]
fn every_runbook_is_in_its_page_index() {
    let mut problems = Vec::new();
    for page in RUNBOOK_PAGES {
        let text = std::fs::read_to_string(root().join(page)).unwrap_or_default();
        for missing in missing_from_index(&text) {
            problems.push(format!("{page}: #{missing} is not in the index at its top"));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn an_index_names_every_section() {
    let page = "# R\n\n- [A](#a) · [B](#b)\n\n## Group\n\n### A\n\n### B\n\n### C\n\nsee [C](#c)\n";
    assert_eq!(missing_from_index(page), ["c"]);
}
