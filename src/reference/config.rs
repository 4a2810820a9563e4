//! `config.md`: every key of the config file, from the config structs themselves.
//!
//! The keys, their nesting and their docs are read from the sources of `src/config/` (the
//! `///` comment of each field is the key's documentation, so the page and the code's own
//! docs are one text); the types from the fields' Rust types (an enum's values from its
//! variants and `rename_all`); the defaults from `Config::default()` serialized as the file
//! would be. The page fails to generate, with the key named, when a key has no doc, a type
//! has no name here, or a default key is missing from the walk.

use std::collections::BTreeMap;
use std::path::Path;

use crate::config::{Config, OWNED_KAFKA_PROPERTIES, UNSAFE_KAFKA_PROPERTIES};

/// A `pub struct` of the config sources: its doc and its fields.
#[derive(Debug, Default)]
struct Struct {
    doc: Vec<String>,
    fields: Vec<Field>,
}

#[derive(Debug)]
struct Field {
    /// The key in the file (the field's name, or its `#[serde(rename = "…")]`).
    key: String,
    ty: String,
    doc: Vec<String>,
}

/// The value names of a `pub enum`, spelled as in the file.
type Enums = BTreeMap<String, Vec<String>>;

/// Reads every `.rs` file under `src/config` (tests aside) into structs and enums.
fn parse_sources() -> (BTreeMap<String, Struct>, Enums) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/config");
    let mut files = Vec::new();
    let mut dirs = vec![root];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "rs")
                && path.file_name().is_some_and(|n| n != "tests.rs")
            {
                files.push(path);
            }
        }
    }
    files.sort();
    let (mut structs, mut enums) = (BTreeMap::new(), Enums::new());
    for file in files {
        parse_file(
            &std::fs::read_to_string(&file).unwrap(),
            &mut structs,
            &mut enums,
        );
    }
    (structs, enums)
}

fn parse_file(text: &str, structs: &mut BTreeMap<String, Struct>, enums: &mut Enums) {
    enum In {
        Top,
        Struct(String),
        Enum(String, String),
    }
    let mut state = In::Top;
    let (mut doc, mut attrs): (Vec<String>, Vec<String>) = (Vec::new(), Vec::new());
    for raw in text.lines() {
        let line = raw.trim();
        if let Some(text) = line.strip_prefix("///") {
            doc.push(text.strip_prefix(' ').unwrap_or(text).to_string());
            continue;
        }
        if line.starts_with("#[") {
            attrs.push(line.to_string());
            continue;
        }
        match &mut state {
            In::Top => {
                if let Some(rest) = line.strip_prefix("pub struct ") {
                    if let Some(name) = rest.strip_suffix(" {") {
                        structs.insert(
                            name.to_string(),
                            Struct {
                                doc: std::mem::take(&mut doc),
                                fields: Vec::new(),
                            },
                        );
                        state = In::Struct(name.to_string());
                    }
                } else if let Some(rest) = line.strip_prefix("pub enum ") {
                    if let Some(name) = rest.strip_suffix(" {") {
                        let case = attrs
                            .iter()
                            .find_map(|a| quoted_after(a, "rename_all = "))
                            .unwrap_or_default();
                        enums.insert(name.to_string(), Vec::new());
                        state = In::Enum(name.to_string(), case);
                    }
                }
            }
            In::Struct(name) => {
                if raw.starts_with('}') {
                    state = In::Top;
                } else if let Some(rest) = line.strip_prefix("pub ") {
                    if let Some((field, ty)) = rest.split_once(": ") {
                        let key = attrs
                            .iter()
                            .find_map(|a| quoted_after(a, "rename = "))
                            .unwrap_or_else(|| field.to_string());
                        structs.get_mut(name.as_str()).unwrap().fields.push(Field {
                            key,
                            ty: ty.trim_end_matches(',').to_string(),
                            doc: std::mem::take(&mut doc),
                        });
                    }
                }
            }
            In::Enum(name, case) => {
                if raw.starts_with('}') {
                    state = In::Top;
                } else {
                    let variant: String = line
                        .chars()
                        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                        .collect();
                    if variant
                        .chars()
                        .next()
                        .is_some_and(|c| c.is_ascii_uppercase())
                        && raw.starts_with("    ")
                        && !raw.starts_with("     ")
                    {
                        let spelled = attrs
                            .iter()
                            .find_map(|a| quoted_after(a, "rename = "))
                            .unwrap_or_else(|| rename(&variant, case));
                        enums.get_mut(name.as_str()).unwrap().push(spelled);
                    }
                }
            }
        }
        if !line.is_empty() {
            doc.clear();
            attrs.clear();
        }
    }
}

/// The string literal after `marker` in an attribute: `rename = "match"` → `match`.
fn quoted_after(attribute: &str, marker: &str) -> Option<String> {
    let rest = &attribute[attribute.find(marker)? + marker.len()..];
    let rest = rest.strip_prefix('"')?;
    Some(rest[..rest.find('"')?].to_string())
}

/// A variant's name as serde's `rename_all` spells it.
fn rename(variant: &str, case: &str) -> String {
    let mut words = Vec::new();
    let mut word = String::new();
    for c in variant.chars() {
        if c.is_ascii_uppercase() && !word.is_empty() {
            words.push(std::mem::take(&mut word));
        }
        word.push(c.to_ascii_lowercase());
    }
    words.push(word);
    match case {
        "snake_case" => words.join("_"),
        "kebab-case" => words.join("-"),
        "lowercase" => words.concat(),
        _ => variant.to_string(),
    }
}

/// One key of the page.
struct Key {
    path: String,
    ty: String,
    default: String,
    doc: String,
}

/// One section of the page: `[postgres]`, `[[outbox.tables]]`, …
struct Section {
    title: String,
    doc: String,
    keys: Vec<Key>,
}

/// Walks the structs from `Config`, a section per struct, a key per other field.
struct Walk<'a> {
    structs: &'a BTreeMap<String, Struct>,
    enums: &'a Enums,
    defaults: toml::Value,
    /// Struct name → the section that first showed it (a second use refers to it).
    shown: BTreeMap<String, String>,
    sections: Vec<Section>,
}

impl Walk<'_> {
    /// `path`: the section's key path (`outbox.tables`), `array`: entries of an array of
    /// tables (no defaults of their own), `parent`: the struct holding it.
    fn section(&mut self, name: &str, path: &str, array: bool, parent: Option<&Struct>) {
        let item = &self.structs[name];
        self.shown.insert(name.to_string(), path.to_string());
        let title = if array {
            format!("[[{path}]]")
        } else {
            format!("[{path}]")
        };
        let at = self.sections.len();
        self.sections.push(Section {
            title,
            doc: prose(&item.doc),
            keys: Vec::new(),
        });
        // Arrays of tables last: a struct used both plainly and inside an array entry is
        // shown where it has defaults (`[outbox.serialization]`, not under `[[outbox.tables]]`).
        let mut arrays = Vec::new();
        for field in &item.fields {
            let key_path = format!("{path}.{}", field.key);
            let inner = strip(&field.ty, "Option<").unwrap_or(&field.ty);
            if let Some(element) = strip(inner, "Vec<").filter(|e| self.structs.contains_key(*e)) {
                arrays.push((element, key_path));
                continue;
            }
            if self.structs.contains_key(inner) {
                match self.shown.get(inner) {
                    Some(first) => {
                        let first = first.clone();
                        let doc = doc_or_inherited(field, path, parent, &key_path);
                        self.sections[at].keys.push(Key {
                            path: key_path,
                            ty: format!("table: the keys of `[{first}]`"),
                            default: "absent".to_string(),
                            doc,
                        });
                    }
                    None => self.section(inner, &key_path, array, Some(item)),
                }
                continue;
            }
            let default = if array {
                match parent.and_then(|p| p.fields.iter().find(|f| f.key == field.key)) {
                    Some(_) => format!("`{}`'s", parent_key(path, &field.key)),
                    None => "required".to_string(),
                }
            } else {
                match lookup(&self.defaults, &key_path) {
                    Some(value) => format!("`{}`", inline(value)),
                    None => panic!("config key `{key_path}` has no default in Config::default()"),
                }
            };
            let ty = type_name(&field.ty, self.enums).unwrap_or_else(|| {
                panic!(
                    "config key `{key_path}`: no name for its type `{}`; add one to \
                     src/reference/config.rs::type_name",
                    field.ty
                )
            });
            let doc = doc_or_inherited(field, path, parent, &key_path);
            self.sections[at].keys.push(Key {
                path: key_path,
                ty,
                default,
                doc,
            });
        }
        for (element, key_path) in arrays {
            self.section(element, &key_path, true, Some(item));
        }
    }
}

/// The key an array entry's field overrides: `outbox.tables` + `topic` → `outbox.topic`.
fn parent_key(array_path: &str, key: &str) -> String {
    match array_path.rsplit_once('.') {
        Some((parent, _)) => format!("{parent}.{key}"),
        None => key.to_string(),
    }
}

/// The field's doc; an undocumented field of an array entry that repeats a key of the struct
/// above is that key's override. Any other undocumented key stops the generator.
fn doc_or_inherited(field: &Field, path: &str, parent: Option<&Struct>, key_path: &str) -> String {
    if !field.doc.is_empty() {
        return prose(&field.doc);
    }
    if parent.is_some_and(|p| p.fields.iter().any(|f| f.key == field.key)) {
        return format!(
            "`{}` for this entry; absent: inherited.",
            parent_key(path, &field.key)
        );
    }
    panic!("config key `{key_path}` has no doc comment: document the field in src/config/");
}

fn strip<'t>(ty: &'t str, wrapper: &str) -> Option<&'t str> {
    ty.strip_prefix(wrapper)?.strip_suffix('>')
}

/// How the page names a field's type.
fn type_name(ty: &str, enums: &Enums) -> Option<String> {
    if let Some(inner) = strip(ty, "Option<") {
        return Some(format!("{}, optional", type_name(inner, enums)?));
    }
    if let Some(inner) = strip(ty, "Vec<") {
        return Some(format!("array of {}", type_name(inner, enums)?));
    }
    if let Some(pair) = strip(ty, "BTreeMap<") {
        let (_, value) = pair.split_once(", ")?;
        return Some(format!("table of {}", type_name(value, enums)?));
    }
    let name = match ty {
        "u64" | "u32" | "usize" | "i32" | "i64" => "integer",
        "bool" => "boolean",
        "String" => "string",
        "PathBuf" => "path",
        "Secret" => "string, secret",
        "SampleRatio" => "number",
        _ => {
            let values = enums.get(ty)?;
            let values: Vec<String> = values.iter().map(|v| format!("`{v}`")).collect();
            return Some(format!("one of {}", values.join(", ")));
        }
    };
    Some(name.to_string())
}

/// The value at a dotted path of the serialized defaults.
fn lookup<'v>(value: &'v toml::Value, path: &str) -> Option<&'v toml::Value> {
    path.split('.').try_fold(value, |v, key| v.get(key))
}

fn inline(value: &toml::Value) -> String {
    match value {
        toml::Value::Table(t) if t.is_empty() => "{}".to_string(),
        toml::Value::Table(t) => {
            let members: Vec<String> = t
                .iter()
                .map(|(k, v)| format!("{k} = {}", inline(v)))
                .collect();
            format!("{{ {} }}", members.join(", "))
        }
        other => other.to_string(),
    }
}

/// Doc lines as markdown: lines joined, paragraphs and list items kept, rustdoc links
/// (`` [`Name`] ``) shown as code.
fn prose(lines: &[String]) -> String {
    let mut out = String::new();
    for line in lines {
        if line.is_empty() {
            out.push_str("\n\n");
        } else if line.starts_with("- ") || line.starts_with("1. ") {
            if !out.is_empty() && !out.ends_with('\n') {
                out.push('\n');
            }
            out.push_str(line);
        } else {
            if !out.is_empty() && !out.ends_with('\n') {
                out.push(' ');
            }
            out.push_str(line.trim_start());
        }
    }
    let links = regex::Regex::new(r"\[(`[^`]+`)\](\([^)]*\))?").unwrap();
    super::escape_angles(&links.replace_all(out.trim(), "$1"))
}

/// Every key of the serialized defaults: a non-empty table is a section, walked into.
fn leaf_keys(value: &toml::Value, prefix: &str, out: &mut Vec<String>) {
    let toml::Value::Table(table) = value else {
        return;
    };
    for (key, v) in table {
        let path = if prefix.is_empty() {
            key.clone()
        } else {
            format!("{prefix}.{key}")
        };
        match v {
            toml::Value::Table(t) if !t.is_empty() => leaf_keys(v, &path, out),
            _ => out.push(path),
        }
    }
}

pub(super) fn page() -> String {
    let (structs, enums) = parse_sources();
    let defaults = toml::Value::try_from(Config::default()).unwrap();
    let mut walk = Walk {
        structs: &structs,
        enums: &enums,
        defaults: defaults.clone(),
        shown: BTreeMap::new(),
        sections: Vec::new(),
    };
    for field in &structs["Config"].fields {
        walk.section(&field.ty, &field.key, false, None);
    }
    // Every key `Config::default()` writes is on the page (a table section counts for its keys).
    let shown: Vec<&str> = walk
        .sections
        .iter()
        .flat_map(|s| s.keys.iter().map(|k| k.path.as_str()))
        .collect();
    let sections: Vec<String> = walk
        .sections
        .iter()
        .map(|s| s.title.trim_matches(['[', ']']).to_string())
        .collect();
    let mut leaves = Vec::new();
    leaf_keys(&defaults, "", &mut leaves);
    for leaf in &leaves {
        assert!(
            shown.contains(&leaf.as_str()) || sections.contains(leaf),
            "config key `{leaf}` is in Config::default() but not found in the structs of src/config/"
        );
    }

    let mut out = super::banner("the structs of `src/config/`");
    out.push_str("# Configuration reference\n\n");
    out.push_str(
        "Every key of the config file, by section: its type, its default and what it does. \
         `config/outbox-relay.toml` is a commented example; `outbox-relay config` prints the \
         effective configuration. Every key can also be set from the environment as \
         `OUTBOX_RELAY__<SECTION>__<KEY>` (upper case, `__` between levels), e.g. \
         `OUTBOX_RELAY__POSTGRES__SLOT`. An optional key is unset when absent or `\"\"`.\n",
    );
    for section in &walk.sections {
        out.push_str(&format!("\n## `{}`\n\n", section.title));
        if !section.doc.is_empty() {
            out.push_str(&section.doc);
            out.push_str("\n\n");
        }
        for key in &section.keys {
            out.push_str(&format!(
                "### `{}`\n\n*{}* · default {}\n\n{}\n\n",
                key.path, key.ty, key.default, key.doc
            ));
        }
    }
    out.push_str(&refused_properties());
    while out.ends_with("\n\n") {
        out.pop();
    }
    out
}

/// The librdkafka properties `kafka.properties` refuses: the ones the relay sets from its own
/// keys, and the values that would break the delivery guarantee.
fn refused_properties() -> String {
    let mut out = String::from(
        "\n## Refused librdkafka properties\n\n\
         `kafka.properties` refuses (exit 2, naming the key) the librdkafka properties the relay \
         sets from its own keys:\n\n\
         | property | set it with |\n|---|---|\n",
    );
    for (property, key) in OWNED_KAFKA_PROPERTIES {
        out.push_str(&format!("| `{property}` | `{key}` |\n"));
    }
    out.push_str(
        "\nand the values that would break at-least-once delivery or per-key order, unless \
         `kafka.allow_unsafe_kafka_settings = true` (then each is logged as a warning at start):\n\n\
         | property | refused values | why |\n|---|---|---|\n",
    );
    for property in UNSAFE_KAFKA_PROPERTIES {
        let keys: Vec<String> = property.keys.iter().map(|k| format!("`{k}`")).collect();
        out.push_str(&format!(
            "| {} | {} | {} |\n",
            keys.join(", "),
            property.refused,
            property.reason
        ));
    }
    out.push_str(
        "\nProperty names are compared in lower case, values trimmed and in lower case.\n\n",
    );
    out
}
