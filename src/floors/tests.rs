use std::path::{Path, PathBuf};

use super::*;

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// The arrows of `root`'s crate, described for a failure message.
fn describe(arrows: &[Arrow], files: &[PathBuf], base: &Path) -> String {
    let short = |p: &Path| p.strip_prefix(base).unwrap_or(p).display().to_string();
    arrows
        .iter()
        .filter(|(from, to, _)| files.contains(from) && files.contains(to))
        .map(|(from, to, named)| format!("  {} -> {}: {named}", short(from), short(to)))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Arrows against the floors: (arrow, floor of the user, floor of the used).
fn against_floors(src: &Path, arrows: &[Arrow]) -> Result<Vec<String>, String> {
    let mut wrong = Vec::new();
    for (from, to, named) in arrows {
        let short = |p: &Path| p.strip_prefix(src).unwrap_or(p).display().to_string();
        let (Some(a), Some(b)) = (floor_of(src, from), floor_of(src, to)) else {
            let unplaced = if floor_of(src, from).is_none() {
                from
            } else {
                to
            };
            return Err(format!(
                "{} stands on no floor: add its folder to FLOORS in src/floors.rs, with why it stands there",
                short(unplaced)
            ));
        };
        if b > a {
            wrong.push(format!(
                "{} (floor {}, {}) uses {} (floor {}, {}): {named}",
                short(from),
                a + 1,
                FLOORS[a].0,
                short(to),
                b + 1,
                FLOORS[b].0
            ));
        }
    }
    Ok(wrong)
}

/// The roots of the crates whose files must not use each other in a circle: the library, the
/// relay's binary, any other binary in `src/bin`, and the benchmark's crate (`bench/`).
fn crate_roots(src: &Path) -> Vec<PathBuf> {
    let bench = Path::new(env!("CARGO_MANIFEST_DIR")).join("bench/src/main.rs");
    let mut roots = vec![src.join("lib.rs"), src.join("main.rs"), bench];
    if let Ok(bins) = std::fs::read_dir(src.join("bin")) {
        for bin in bins.flatten() {
            let main = bin.path().join("main.rs");
            if main.exists() {
                roots.push(main);
            } else if bin.path().extension().is_some_and(|e| e == "rs") {
                roots.push(bin.path());
            }
        }
    }
    roots
}

#[test]
fn the_library_uses_nothing_above_its_floor() {
    let src = src();
    let modules = modules(&src.join("lib.rs"));
    assert!(
        modules.len() > 50,
        "the sources were not read: {}",
        modules.len()
    );
    let arrows: Vec<Arrow> = arrows(&modules)
        .into_iter()
        .filter(|(from, _, _)| from != &src.join("lib.rs"))
        .collect();
    let wrong = against_floors(&src, &arrows).unwrap_or_else(|e| panic!("{e}"));
    assert!(
        wrong.is_empty(),
        "{} arrow(s) run up against the floors (src/floors.rs says which folder may use which):\n{}",
        wrong.len(),
        wrong.join("\n")
    );
}

/// Records out, nothing read: the sink is handed what it needs from PostgreSQL (the relay
/// reads the slot's identity and the WAL position for exactly-once), so that the floor order
/// says the truth about who talks to the database.
#[test]
fn the_sink_never_talks_to_postgresql() {
    let src = src();
    let offenders: Vec<String> = modules(&src.join("lib.rs"))
        .iter()
        .filter(|m| m.file.starts_with(src.join("sink")))
        .filter_map(|m| {
            let text = std::fs::read_to_string(&m.file).ok()?;
            let line = text
                .lines()
                .position(|l| l.contains("tokio_postgres") && !l.trim_start().starts_with("//"))?;
            Some(format!(
                "{}:{}",
                m.file.strip_prefix(&src).unwrap_or(&m.file).display(),
                line + 1
            ))
        })
        .collect();
    assert!(
        offenders.is_empty(),
        "the sink uses tokio_postgres (hand it what it needs from the relay instead):\n{}",
        offenders.join("\n")
    );
}

#[test]
fn no_files_use_each_other_in_a_circle() {
    let src = src();
    let mut found = Vec::new();
    let roots = crate_roots(&src);
    for root in &roots {
        assert!(root.exists(), "no crate root at {}", root.display());
        let arrows = arrows(&modules(root));
        for circle in circles(&arrows) {
            found.push(format!(
                "a circle of {} files:\n{}",
                circle.len(),
                describe(&arrows, &circle, Path::new(env!("CARGO_MANIFEST_DIR")))
            ));
        }
    }
    assert!(found.is_empty(), "{}", found.join("\n"));
}

/// A crate in a temporary folder: `files` are (path under `src`, text).
fn tree(name: &str, files: &[(&str, &str)]) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("floors-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    for (path, text) in files {
        let path = dir.join(path);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    }
    dir
}

#[test]
fn a_circle_is_found_and_named_by_its_arrows() {
    let src = tree(
        "circle",
        &[
            ("lib.rs", "pub mod sink;\n"),
            (
                "sink/mod.rs",
                "pub mod a;\n#[path = \"b_file.rs\"]\nmod b;\n#[cfg(test)]\nmod tests;\n",
            ),
            ("sink/a.rs", "use super::b::{Thing, other::More};\n"),
            ("sink/b_file.rs", "pub fn f() { crate::sink::a::g() }\n"),
            ("sink/tests.rs", "use crate::sink::a::X;\n"),
        ],
    );
    let modules = modules(&src.join("lib.rs"));
    assert_eq!(modules.len(), 4, "{modules:?}");
    let arrows = arrows(&modules);
    let circles = circles(&arrows);
    assert_eq!(circles.len(), 1, "{arrows:?}");
    let named = describe(&arrows, &circles[0], &src);
    assert!(
        named.contains("sink/a.rs -> sink/b_file.rs: super::b::Thing"),
        "{named}"
    );
    assert!(
        named.contains("sink/b_file.rs -> sink/a.rs: crate::sink::a::g"),
        "{named}"
    );
}

#[test]
fn an_arrow_up_is_named_and_a_childs_use_of_its_parent_is_not_an_arrow() {
    let src = tree(
        "up",
        &[
            ("lib.rs", "pub mod config;\npub mod sink;\n"),
            (
                "config.rs",
                "use crate::sink::{publisher::Publisher, Other as O};\n",
            ),
            (
                "sink/mod.rs",
                "pub mod publisher;\nuse publisher::Publisher;\n",
            ),
            ("sink/publisher.rs", "use super::Shared;\n"),
        ],
    );
    let arrows = arrows(&modules(&src.join("lib.rs")));
    assert!(circles(&arrows).is_empty(), "{arrows:?}");
    let wrong = against_floors(&src, &arrows).unwrap();
    assert_eq!(wrong.len(), 2, "{wrong:?}");
    assert!(
        wrong[0].starts_with(
            "config.rs (floor 3, config) uses sink/mod.rs (floor 8, sink): crate::sink::Other"
        ),
        "{wrong:?}"
    );
}

#[test]
fn an_inline_path_ends_where_its_segments_stop_being_joined_by_colons() {
    let paths = named_paths(
        "fn f() {\n    let s = crate::sink::open(&c.kafka, facts)?;\n    Ok(x::Y::new(crate::lsn::Lsn::ZERO))\n}\n",
    );
    assert_eq!(
        paths,
        vec![
            vec!["crate", "sink", "open"],
            vec!["crate", "lsn", "Lsn", "ZERO"],
        ],
        "{paths:?}"
    );
}
