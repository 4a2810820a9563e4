//! `commands.md`: every command and flag, walked from the command line's clap definition
//! (`ops::cli::Cli`), with the same help texts `--help` prints.

use clap::{Arg, Command, CommandFactory};

use crate::ops::cli::Cli;

/// `--name`, `-s, --name`, or `<NAME>` for a positional argument.
fn flag(arg: &Arg) -> String {
    match (arg.get_short(), arg.get_long()) {
        (Some(short), Some(long)) => format!("`-{short}, --{long}`"),
        (None, Some(long)) => format!("`--{long}`"),
        (Some(short), None) => format!("`-{short}`"),
        (None, None) => format!("`<{}>`", arg.get_id().as_str().to_uppercase()),
    }
}

/// The value a flag takes (`<LSN|now>`), or nothing for a switch.
fn value(arg: &Arg) -> String {
    if !arg.get_action().takes_values() {
        return String::new();
    }
    let names: Vec<String> = match arg.get_value_names() {
        Some(names) => names.iter().map(|n| n.to_string()).collect(),
        None => vec![arg.get_id().as_str().to_uppercase()],
    };
    format!("`<{}>`", names.join(" "))
}

/// A help text for a table cell: one line, `|` escaped.
fn cell(text: &str) -> String {
    super::escape_angles(&text.split_whitespace().collect::<Vec<_>>().join(" ")).replace('|', "\\|")
}

fn arguments_table(arguments: &[&Arg]) -> String {
    let mut out = String::from("| Flag | Value | Default | Environment | Description |\n");
    out.push_str("|---|---|---|---|---|\n");
    for arg in arguments {
        let defaults: Vec<String> = arg
            .get_default_values()
            .iter()
            .map(|v| format!("`{}`", v.to_string_lossy()))
            .collect();
        let env = arg
            .get_env()
            .map(|e| format!("`{}`", e.to_string_lossy()))
            .unwrap_or_default();
        let help = arg
            .get_long_help()
            .or(arg.get_help())
            .map(|h| cell(&h.to_string()))
            .unwrap_or_default();
        out.push_str(&format!(
            "| {} | {} | {} | {} | {} |\n",
            flag(arg),
            value(arg),
            defaults.join(", "),
            env,
            help
        ));
    }
    out
}

/// The flags of `command` worth listing: not `--help`/`--version`, not the global ones
/// (listed once, at the top).
fn own_arguments(command: &Command) -> Vec<&Arg> {
    command
        .get_arguments()
        .filter(|a| !matches!(a.get_id().as_str(), "help" | "version"))
        .filter(|a| !a.is_global_set())
        .collect()
}

/// The subcommands, without clap's generated `help`.
fn listed(command: &Command) -> impl Iterator<Item = &Command> {
    command.get_subcommands().filter(|s| s.get_name() != "help")
}

fn section(command: &Command, path: &str, out: &mut String) {
    let leaf = listed(command).next().is_none();
    out.push_str(&format!("\n## `{path}`\n\n"));
    if let Some(about) = command.get_long_about().or(command.get_about()) {
        out.push_str(&super::escape_angles(about.to_string().trim()));
        out.push_str("\n\n");
    }
    if leaf {
        let arguments = own_arguments(command);
        if arguments.is_empty() {
            out.push_str("No flags of its own.\n");
        } else {
            out.push_str(&arguments_table(&arguments));
        }
    } else {
        let names: Vec<String> = listed(command)
            .map(|s| format!("`{}`", s.get_name()))
            .collect();
        out.push_str(&format!("Subcommands: {}.\n", names.join(", ")));
    }
    for sub in listed(command) {
        section(sub, &format!("{path} {}", sub.get_name()), out);
    }
}

pub(super) fn page() -> String {
    let mut cli = Cli::command();
    cli.build();
    let mut out = super::banner("the command line's definition (`src/ops/cli.rs`)");
    out.push_str("# Command reference\n\n");
    if let Some(about) = cli.get_about() {
        out.push_str(&format!("`{}`: {}.\n\n", cli.get_name(), about));
    }
    out.push_str(
        "Exit codes: 0 success, 1 failure (a problem found, a refused operation, a server or \
         Kafka error), 2 usage or configuration error; `run` exits 3 when the slot is lost or \
         dropped.\n\n## Global flags\n\nAccepted by every command.\n\n",
    );
    let globals: Vec<&Arg> = cli.get_arguments().filter(|a| a.is_global_set()).collect();
    out.push_str(&arguments_table(&globals));
    for sub in listed(&cli) {
        section(
            sub,
            &format!("{} {}", cli.get_name(), sub.get_name()),
            &mut out,
        );
    }
    while out.ends_with('\n') {
        out.pop();
    }
    out.push('\n');
    out
}
