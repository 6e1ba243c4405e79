//! The command line with a RocketMQ property file under it (part of the `shardmq` binary, not
//! the library): `-c FILE` is read first (`shardmq::conf` turns its keys into flags), the
//! flags the user typed are laid over it, and one clap parse of the result gives the
//! options, so a file can set nothing the command line could not. What each setting's value
//! is and where it came from (default, file, flag; the profile's knobs are filled in once the
//! profile is resolved) is kept for `--print-config`.

use std::ffi::OsString;
use std::path::PathBuf;

use clap::parser::ValueSource;
use clap::{ArgMatches, CommandFactory, FromArgMatches};
use shardmq::conf::{self, FileSettings, Role};

/// Arguments that are not settings.
const NOT_SETTINGS: [&str; 4] = ["help", "version", "config_file", "print_config"];

/// One setting as `--print-config` shows it.
pub struct Row {
    /// The flag's long name, without dashes.
    pub flag: String,
    /// None: not given anywhere (the profile or nothing decides).
    pub value: Option<String>,
    pub source: String,
}

/// Where the settings came from.
#[derive(Default)]
pub struct Provenance {
    pub rows: Vec<Row>,
    pub file: Option<FileSettings>,
}

pub enum Failure {
    /// Usage errors, --help and --version (clap prints them).
    Clap(clap::Error),
    /// The property file cannot be taken.
    File(String),
}

/// Parses `argv` with the `-c` file (if any) beneath it.
pub fn parse<C: CommandFactory + FromArgMatches>(
    argv: Vec<OsString>,
) -> Result<(C, Provenance), Failure> {
    let command = C::command();
    let user = command
        .clone()
        .try_get_matches_from(&argv)
        .map_err(Failure::Clap)?;
    let Some((sub, user_sub)) = user.subcommand() else {
        return Ok((from_matches(&user)?, Provenance::default()));
    };
    let role = match sub {
        "serve" => Role::Serve,
        "broker" => Role::Broker,
        "namesrv" => Role::Namesrv,
        _ => return Ok((from_matches(&user)?, Provenance::default())),
    };
    let Some(path) = user_sub.get_one::<PathBuf>("config_file") else {
        let rows = rows(&command, sub, user_sub, user_sub, None);
        return Ok((from_matches(&user)?, Provenance { rows, file: None }));
    };
    let file = conf::load(path, role).map_err(Failure::File)?;
    let sub_command = command
        .find_subcommand(sub)
        .expect("the matched subcommand exists");
    let at = argv
        .iter()
        .position(|word| word.as_os_str() == sub)
        .expect("the subcommand is on the command line");
    let mut merged: Vec<OsString> = argv[..=at].to_vec();
    for arg in &file.args {
        let long = sub_command
            .get_arguments()
            .find(|candidate| candidate.get_id() == arg.id)
            .and_then(|candidate| candidate.get_long())
            .ok_or_else(|| {
                Failure::File(format!(
                    "{}: {} cannot be used with `shardmq {sub}`",
                    file.path.display(),
                    arg.key
                ))
            })?;
        if user_sub.value_source(arg.id) == Some(ValueSource::CommandLine) {
            continue;
        }
        merged.push(format!("--{long}={}", arg.value).into());
    }
    merged.extend(argv[at + 1..].iter().cloned());
    let merged = command
        .clone()
        .try_get_matches_from(merged)
        .map_err(Failure::Clap)?;
    let merged_sub = merged.subcommand_matches(sub).expect("the same subcommand");
    let rows = rows(&command, sub, user_sub, merged_sub, Some(&file));
    Ok((
        from_matches(&merged)?,
        Provenance {
            rows,
            file: Some(file),
        },
    ))
}

fn from_matches<C: FromArgMatches>(matches: &ArgMatches) -> Result<C, Failure> {
    C::from_arg_matches(matches).map_err(Failure::Clap)
}

fn rows(
    command: &clap::Command,
    sub: &str,
    user: &ArgMatches,
    merged: &ArgMatches,
    file: Option<&FileSettings>,
) -> Vec<Row> {
    let Some(sub_command) = command.find_subcommand(sub) else {
        return Vec::new();
    };
    let mut rows = Vec::new();
    for arg in sub_command.get_arguments() {
        let id = arg.get_id().as_str();
        let Some(long) = arg.get_long() else { continue };
        if NOT_SETTINGS.contains(&id) || arg.is_hide_set() {
            continue;
        }
        let value = merged.get_raw(id).map(|values| {
            values
                .map(|value| value.to_string_lossy().into_owned())
                .collect::<Vec<_>>()
                .join(",")
        });
        let from_file = file.and_then(|file| Some((file.args.iter().find(|a| a.id == id)?, file)));
        let source = match (merged.value_source(id), user.value_source(id), from_file) {
            (_, Some(ValueSource::CommandLine), _) => "flag".to_string(),
            (Some(ValueSource::CommandLine), _, Some((arg, file))) => {
                format!("file {}:{} ({})", file.path.display(), arg.line, arg.key)
            }
            (Some(ValueSource::DefaultValue), _, _) => "default".to_string(),
            (Some(ValueSource::EnvVariable), _, _) => "environment".to_string(),
            _ => String::new(),
        };
        rows.push(Row {
            flag: long.to_string(),
            value,
            source,
        });
    }
    rows
}
