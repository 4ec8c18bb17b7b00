//! `tolerable reference` (hidden): the files generated from the code, printed as they should
//! be committed. Whole files (tolerable.toml, kustomize/base/tolerable.toml) are printed
//! outright; in the others a marked block is replaced and the hand-written text around it
//! kept, read from `--root`. `make generate` writes every file of `--list`;
//! `tests/project/generated.rs` compares each with the committed one.

use std::fmt::Write as _;
use std::io::Write;
use std::path::Path;
use std::process::ExitCode;

use anyhow::{bail, Context as _};
use clap::CommandFactory as _;

use crate::cli::{Cli, ReferenceArgs};
use crate::config::reference::{self as config, Profile};

/// Every generated file, as a path inside the repository.
pub(crate) const FILES: &[&str] = &[
    "tolerable.toml",
    "kustomize/base/tolerable.toml",
    "docs/configuration.md",
    "charts/tolerable/values.yaml",
    "charts/tolerable/values.schema.json",
    "docs/cli.md",
];

/// The commands whose synopsis docs/cli.md shows in its own section (a block each).
const SYNOPSES: &[&str] = &["review", "audit", "inspect", "gates", "crashes"];

pub(crate) fn run(args: &ReferenceArgs, out: &mut impl Write) -> anyhow::Result<ExitCode> {
    if args.list {
        for file in FILES {
            writeln!(out, "{file}")?;
        }
        return Ok(ExitCode::SUCCESS);
    }
    let file = args.file.as_deref().unwrap_or_default();
    out.write_all(contents(&args.root, file)?.as_bytes())?;
    Ok(ExitCode::SUCCESS)
}

/// What `file` should hold.
fn contents(root: &Path, file: &str) -> anyhow::Result<String> {
    let current = || {
        std::fs::read_to_string(root.join(file))
            .with_context(|| format!("{}: the hand-written parts are read there", file))
    };
    Ok(match file {
        "tolerable.toml" => config::config_toml(Profile::Shipped),
        "kustomize/base/tolerable.toml" => config::config_toml(Profile::Deployed),
        "docs/configuration.md" => {
            let text = splice(
                file,
                &current()?,
                &Markdown,
                "keys",
                &config::configuration_md_keys(),
            )?;
            splice(
                file,
                &text,
                &Markdown,
                "deprecated-keys",
                &config::configuration_md_deprecated(),
            )?
        }
        "charts/tolerable/values.yaml" => splice(
            file,
            &current()?,
            &Yaml,
            "config",
            &config::values_yaml_config(),
        )?,
        "charts/tolerable/values.schema.json" => schema(file, &current()?)?,
        "docs/cli.md" => {
            let mut text = current()?;
            for command in SYNOPSES {
                let block = format!("```\n{}```\n", synopses(command));
                text = splice(
                    file,
                    &text,
                    &Markdown,
                    &format!("synopsis-{command}"),
                    &block,
                )?;
            }
            splice(file, &text, &Markdown, "flags", &flags())?
        }
        other => {
            bail!("{other} is not generated (tolerable reference --list names those that are)")
        }
    })
}

/// How a file's comments mark a generated block.
trait Markers {
    fn begin(&self, name: &str) -> String;
    fn end(&self, name: &str) -> String;
}

struct Markdown;
struct Yaml;

impl Markers for Markdown {
    fn begin(&self, name: &str) -> String {
        format!("<!-- generated: {name} (by `tolerable reference`: edit the code, then `make generate`) -->")
    }
    fn end(&self, name: &str) -> String {
        format!("<!-- end of generated: {name} -->")
    }
}

impl Markers for Yaml {
    fn begin(&self, name: &str) -> String {
        format!(
            "# generated: {name} (by `tolerable reference`: edit the code, then `make generate`)"
        )
    }
    fn end(&self, name: &str) -> String {
        format!("# end of generated: {name}")
    }
}

/// `text` with the lines between the block's markers replaced by `block`.
fn splice(
    file: &str,
    text: &str,
    markers: &impl Markers,
    name: &str,
    block: &str,
) -> anyhow::Result<String> {
    let (begin, end) = (markers.begin(name), markers.end(name));
    let start =
        line_end_after(text, &begin, 0).with_context(|| format!("{file} has no line {begin:?}"))?;
    let stop = line_start_of(text, &end, start)
        .with_context(|| format!("{file} has no line {end:?} after {begin:?}"))?;
    Ok(format!("{}{block}{}", &text[..start], &text[stop..]))
}

/// Where the line after the first line equal to `line` (from `from`) starts.
fn line_end_after(text: &str, line: &str, from: usize) -> Option<usize> {
    line_start_of(text, line, from).map(|at| at + line.len() + 1)
}

/// Where the first line equal to `line` (from `from`) starts.
fn line_start_of(text: &str, line: &str, from: usize) -> Option<usize> {
    let mut at = from;
    for candidate in text[from..].split_inclusive('\n') {
        if candidate.trim_end_matches('\n') == line {
            return Some(at);
        }
        at += candidate.len();
    }
    None
}

/// values.schema.json with its `config` property, the last of its top-level properties (JSON
/// has no comments to mark a block), replaced.
fn schema(file: &str, text: &str) -> anyhow::Result<String> {
    const START: &str = "    \"config\": {";
    const TAIL: &str = "  }\n}\n";
    let start =
        line_start_of(text, START, 0).with_context(|| format!("{file} has no line {START:?}"))?;
    if !text.ends_with(TAIL) {
        bail!("{file} does not end with the top-level properties' close ({TAIL:?})");
    }
    Ok(format!(
        "{}{}{TAIL}",
        &text[..start],
        config::values_schema_config()
    ))
}

/// The commands under `tolerable` (one level of subcommands below `name`, when it has them),
/// built so that global flags are propagated.
fn command(name: &str) -> clap::Command {
    let mut root = Cli::command();
    root.build();
    root.find_subcommand(name)
        .unwrap_or_else(|| panic!("no subcommand {name}"))
        .clone()
}

/// The synopsis lines of `tolerable NAME` (one per subcommand when it has them).
fn synopses(name: &str) -> String {
    let command = command(name);
    let mut out = String::new();
    let subcommands: Vec<&clap::Command> = command
        .get_subcommands()
        .filter(|c| shown_command(c))
        .collect();
    if subcommands.is_empty() {
        out.push_str(&synopsis(&format!("tolerable {name}"), &command));
    }
    for sub in subcommands {
        let path = format!("tolerable {name} {}", sub.get_name());
        out.push_str(&synopsis(&path, sub));
    }
    out
}

/// `path` and its flags, wrapped at 100 columns under the first flag.
fn synopsis(path: &str, command: &clap::Command) -> String {
    let words: Vec<String> = arguments(command).map(synopsis_word).collect();
    let indent = " ".repeat(path.len() + 1);
    let mut out = path.to_owned();
    let mut width = out.len();
    for word in words {
        if width + 1 + word.len() > 100 && width > indent.len() {
            let _ = write!(out, "\n{indent}{word}");
            width = indent.len() + word.len();
        } else {
            let _ = write!(out, " {word}");
            width += 1 + word.len();
        }
    }
    out.push('\n');
    out
}

/// The flags and operands an operator writes, flags first: not --help, --version, nor
/// `tolerable`'s own flags (`--config`, which every command takes; the page says so once).
fn arguments(command: &clap::Command) -> impl Iterator<Item = &clap::Arg> {
    let shown = |arg: &&clap::Arg| {
        !arg.is_hide_set()
            && Cli::command()
                .get_arguments()
                .all(|own| own.get_id() != arg.get_id())
            && !matches!(
                arg.get_action(),
                clap::ArgAction::Help | clap::ArgAction::HelpLong | clap::ArgAction::Version
            )
    };
    let flags = command
        .get_arguments()
        .filter(shown)
        .filter(|a| !a.is_positional());
    flags.chain(command.get_positionals().filter(shown))
}

/// How an argument is written: `--json`, `-n NAMESPACE`, `[--x]` when optional, `...` when
/// repeatable.
fn synopsis_word(arg: &clap::Arg) -> String {
    let value = value_names(arg);
    let mut word = match (arg.get_short(), arg.get_long()) {
        _ if arg.is_positional() => value.clone(),
        (Some(short), _) => format!("-{short}"),
        (None, Some(long)) => format!("--{long}"),
        (None, None) => arg.get_id().to_string(),
    };
    if !arg.is_positional() && !value.is_empty() {
        let _ = write!(word, " {value}");
    }
    if repeats(arg) {
        word.push_str("...");
    }
    if arg.is_required_set() {
        word
    } else {
        format!("[{word}]")
    }
}

fn value_names(arg: &clap::Arg) -> String {
    if !arg.get_action().takes_values() {
        return String::new();
    }
    match arg.get_value_names() {
        Some(names) => names
            .iter()
            .map(|n| n.as_str())
            .collect::<Vec<_>>()
            .join(" "),
        None => arg.get_id().as_str().to_ascii_uppercase(),
    }
}

fn repeats(arg: &clap::Arg) -> bool {
    matches!(arg.get_action(), clap::ArgAction::Append)
}

/// Every command's flags, a table each: the flag, its default and its help.
fn flags() -> String {
    let mut root = Cli::command();
    root.build();
    let mut out = String::new();
    for command in root.get_subcommands().filter(|c| shown_command(c)) {
        let subcommands: Vec<&clap::Command> = command
            .get_subcommands()
            .filter(|c| shown_command(c))
            .collect();
        if subcommands.is_empty() {
            flag_table(
                &mut out,
                &format!("tolerable {}", command.get_name()),
                command,
            );
        }
        for sub in subcommands {
            let path = format!("tolerable {} {}", command.get_name(), sub.get_name());
            flag_table(&mut out, &path, sub);
        }
    }
    out
}

/// A command an operator runs: not hidden, not clap's own `help`.
fn shown_command(command: &clap::Command) -> bool {
    !command.is_hide_set() && command.get_name() != "help"
}

fn flag_table(out: &mut String, path: &str, command: &clap::Command) {
    let about = command
        .get_about()
        .map(|a| a.to_string())
        .unwrap_or_default();
    let _ = writeln!(out, "\n**`{path}`**: {}\n", one_line(&about));
    out.push_str("| flag | default | meaning |\n| --- | --- | --- |\n");
    for arg in arguments(command) {
        let written = synopsis_word(arg);
        let written = written.trim_start_matches('[').trim_end_matches(']');
        let shown = match (arg.get_short(), arg.get_long()) {
            (Some(_), Some(long)) if !arg.is_positional() => {
                format!("`{written}`, `--{long}`")
            }
            _ => format!("`{written}`"),
        };
        // A switch's `false` says nothing.
        let switch = !arg.get_action().takes_values();
        let defaults: Vec<String> = arg
            .get_default_values()
            .iter()
            .filter(|_| !switch)
            .collect::<Vec<_>>()
            .iter()
            .map(|v| format!("`{}`", v.to_string_lossy()))
            .collect();
        let mut help = arg.get_help().map(|h| h.to_string()).unwrap_or_default();
        if let Some(variable) = arg.get_env() {
            let _ = write!(help, " (also ${})", variable.to_string_lossy());
        }
        let _ = writeln!(
            out,
            "| {} | {} | {} |",
            shown.replace('|', "\\|"),
            defaults.join(", "),
            one_line(&help).replace('|', "\\|")
        );
    }
}

/// Help text on one line: its lines joined by a space.
fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}
