//! The command line: torchrun's options (built from the shared option table, so the
//! real launch and `launch --dry-run` share one parser) and toporun's subcommands.

use crate::subcommands::{Cli, Globals};
use crate::toporun_options::toporun_args;
pub use crate::toporun_options::Extra;
use clap::{Arg, ArgAction, ArgMatches, Command};
use std::collections::BTreeMap;
use toporun_shared::torchrun::{Opt, OPTIONS};

pub const SUBCOMMANDS: &[&str] = &[
    "probe",
    "topo",
    "preflight",
    "launch",
    "bench",
    "nccl-log",
    "stacks",
    "top",
    "fr-trace",
    "help",
];

const ABOUT_LAUNCH: &str =
    "Start one rank per GPU as torchrun would (same options, PET_* variables and worker environment)";

/// torchrun's options plus toporun's launch extras.
pub fn launch_command(name: &'static str) -> Command {
    use clap::Args;
    let cmd = Command::new(name).override_usage(format!(
        "{} [OPTIONS] ENTRYPOINT [ARGS]...",
        if name == "launch" {
            "toporun launch"
        } else {
            name
        }
    ));
    // --facts and --nvidia-smi-topo: the subcommands' own declaration (its doc comment
    // would become the launch's description: ours is set again after it).
    Globals::augment_args(toporun_args(torchrun_args(cmd))).about(ABOUT_LAUNCH)
}

/// torchrun's own options, from the shared table.
fn torchrun_args(mut cmd: Command) -> Command {
    for o in OPTIONS {
        let mut help = format!("{} [env: {}]", o.help, o.opt.pet());
        if let Some(d) = o.default {
            help.push_str(&format!(" [default: {d}]"));
        }
        let mut arg = Arg::new(o.opt.dest()).long(o.longs[0]).help(help);
        for alias in &o.longs[1..] {
            arg = arg.alias(*alias);
        }
        if let Some(s) = o.short {
            arg = arg.short(s);
        }
        arg = if o.flag {
            arg.action(ArgAction::SetTrue)
        } else {
            arg.action(ArgAction::Set).allow_hyphen_values(false)
        };
        if !o.choices.is_empty() {
            arg = arg.value_parser(clap::builder::PossibleValuesParser::new(o.choices));
        }
        cmd = cmd.arg(arg);
    }
    cmd
}

/// toporun's own subcommands (derived in `subcommands`), with the launch beside them.
pub fn toporun_command() -> Command {
    use clap::CommandFactory;
    Cli::command()
        .subcommand(launch_command("launch"))
        .after_help("Every launch option with its variable and default: toporun launch --help")
}

/// The options the command line set, for PET_* precedence.
pub fn set_on_command_line(m: &ArgMatches) -> BTreeMap<Opt, String> {
    let mut out = BTreeMap::new();
    for o in OPTIONS {
        let id = o.opt.dest();
        if m.value_source(id) != Some(clap::parser::ValueSource::CommandLine) {
            continue;
        }
        let v = if o.flag {
            "true".to_string()
        } else {
            m.get_one::<String>(id).cloned().unwrap_or_default()
        };
        out.insert(o.opt, v);
    }
    out
}

/// argparse rejects an unknown `-x` before the entrypoint; clap's trailing argument
/// would take it as the script. Parses like argparse: a dash-led entrypoint is an
/// unknown option unless it came after `--`.
pub fn parse_launch(cmd: Command, argv: &[String]) -> Result<ArgMatches, clap::Error> {
    let mut cmd = cmd;
    let argv = expand_abbreviations(&mut cmd, argv)?;
    let argv = &argv[..];
    if let Some(shell) = completion_request(argv) {
        // As argparse's action: print and exit before the entrypoint is required.
        print_completion(&mut cmd, &shell)?;
        #[allow(clippy::exit)]
        std::process::exit(0);
    }
    let m = cmd.try_get_matches_from_mut(argv)?;
    if let Some(first) = m
        .get_many::<String>(Extra::Command.id())
        .and_then(|mut v| v.next())
    {
        let after_dashdash = argv
            .iter()
            .position(|a| a == "--")
            .is_some_and(|i| argv.get(i + 1) == Some(first));
        if first.starts_with('-') && first != "-" && !after_dashdash {
            let near = nearest_option(&cmd, first)
                .map_or(String::new(), |o| format!("; did you mean '--{o}'?"));
            return Err(cmd.error(clap::error::ErrorKind::UnknownArgument, format!("unrecognized option '{first}'{near} (options go before the entrypoint; use -- before an entrypoint that starts with '-')")));
        }
    }
    Ok(m)
}

/// The long option nearest to a mistyped `--name[=value]`, as clap measures it
/// (Jaro similarity above 0.8), if one is that near.
fn nearest_option(cmd: &Command, given: &str) -> Option<String> {
    let name = given.trim_start_matches('-').split('=').next()?;
    cmd.get_arguments()
        .flat_map(|a| a.get_long_and_visible_aliases().unwrap_or_default())
        .map(|long| (strsim::jaro(name, long), long))
        .filter(|(score, _)| *score > 0.8)
        .max_by(|a, b| a.0.total_cmp(&b.0))
        .map(|(_, long)| long.to_string())
}

/// argparse's abbreviations: a prefix of exactly one option string stands for it; a
/// prefix of several (even two spellings of one option, `--nproc` of
/// `--nproc-per-node` and `--nproc_per_node`) is "ambiguous", exit 2. Stops at the
/// entrypoint: everything after it belongs to the script.
fn expand_abbreviations(cmd: &mut Command, argv: &[String]) -> Result<Vec<String>, clap::Error> {
    let mut longs: Vec<(String, bool)> = Vec::new();
    let mut shorts_with_value: Vec<char> = Vec::new();
    for a in cmd.get_arguments() {
        let takes = a.get_action().takes_values();
        if let Some(l) = a.get_long() {
            longs.push((format!("--{l}"), takes));
        }
        for alias in a.get_all_aliases().unwrap_or_default() {
            longs.push((format!("--{alias}"), takes));
        }
        if let (Some(c), true) = (a.get_short(), takes) {
            shorts_with_value.push(c);
        }
    }
    longs.push(("--help".into(), false));
    let mut out: Vec<String> = argv.iter().take(1).cloned().collect();
    let mut i = 1;
    while i < argv.len() {
        let a = &argv[i];
        if a == "--" || !a.starts_with('-') || a == "-" {
            out.extend(argv[i..].iter().cloned());
            return Ok(out);
        }
        if let Some(rest) = a.strip_prefix("--") {
            let (name, value) = match rest.split_once('=') {
                Some((n, v)) => (format!("--{n}"), Some(v)),
                None => (format!("--{rest}"), None),
            };
            let (full, takes) = match longs.iter().find(|(l, _)| *l == name) {
                Some((l, t)) => (l.clone(), *t),
                None => {
                    let matches: Vec<&(String, bool)> =
                        longs.iter().filter(|(l, _)| l.starts_with(&name)).collect();
                    match matches.as_slice() {
                        [] => (name.clone(), false),
                        [(l, t)] => (l.clone(), *t),
                        many => {
                            let names: Vec<&str> = many.iter().map(|(l, _)| l.as_str()).collect();
                            return Err(cmd.error(
                                clap::error::ErrorKind::UnknownArgument,
                                format!(
                                    "ambiguous option: {name} could match {}",
                                    names.join(", ")
                                ),
                            ));
                        }
                    }
                }
            };
            out.push(match value {
                Some(v) => format!("{full}={v}"),
                None => full,
            });
            if takes && value.is_none() && i + 1 < argv.len() {
                i += 1;
                out.push(argv[i].clone());
            }
        } else {
            // -m, -r VALUE, -rVALUE, -t VALUE.
            out.push(a.clone());
            let c = a.chars().nth(1).unwrap_or(' ');
            if a.len() == 2 && shorts_with_value.contains(&c) && i + 1 < argv.len() {
                i += 1;
                out.push(argv[i].clone());
            }
        }
        i += 1;
    }
    Ok(out)
}

/// `--print-completion SHELL` before the entrypoint (argv already expanded).
fn completion_request(argv: &[String]) -> Option<String> {
    let mut it = argv.iter().skip(1);
    while let Some(a) = it.next() {
        if !a.starts_with('-') || a == "--" {
            return None;
        }
        if a == "--print-completion" || a == "--print_completion" {
            return Some(it.next().cloned().unwrap_or_default());
        }
        if let Some(v) = a
            .strip_prefix("--print-completion=")
            .or_else(|| a.strip_prefix("--print_completion="))
        {
            return Some(v.to_string());
        }
    }
    None
}

/// A completion script of this command for bash, zsh (clap_complete) or tcsh.
fn print_completion(cmd: &mut Command, shell: &str) -> Result<(), clap::Error> {
    let name = cmd.get_name().to_string();
    let mut out = std::io::stdout();
    match shell {
        "bash" => clap_complete::generate(clap_complete::Shell::Bash, cmd, &name, &mut out),
        "zsh" => clap_complete::generate(clap_complete::Shell::Zsh, cmd, &name, &mut out),
        "tcsh" => {
            // clap_complete has no tcsh: complete option names after `-`.
            let mut opts: Vec<String> = cmd
                .get_arguments()
                .filter_map(|a| a.get_long().map(|l| format!("-{l}")))
                .collect();
            opts.sort();
            println!("complete {name} 'c/--/({})/' 'p/*/f/'", opts.iter().map(|o| o.trim_start_matches('-').to_string()).collect::<Vec<_>>().join(" "));
        }
        other => {
            return Err(cmd.error(
                clap::error::ErrorKind::InvalidValue,
                format!("argument --print-completion/--print_completion: invalid choice: '{other}' (choose from bash, zsh, tcsh)"),
            ))
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<ArgMatches, clap::Error> {
        let argv: Vec<String> = std::iter::once("torchrun")
            .chain(args.iter().copied())
            .map(String::from)
            .collect();
        parse_launch(launch_command("torchrun"), &argv)
    }

    #[test]
    fn both_spellings_prefixes_and_trailing_args() {
        let m = parse(&[
            "--nproc_per_node=2",
            "--nnodes",
            "1",
            "--redir=3",
            "train.py",
            "--lr",
            "0.1",
            "--nnodes=9",
        ])
        .unwrap();
        let set = set_on_command_line(&m);
        assert_eq!(set[&Opt::NprocPerNode], "2");
        assert_eq!(set[&Opt::Redirects], "3");
        assert_eq!(set[&Opt::Nnodes], "1");
        let cmd: Vec<&String> = m.get_many::<String>(Extra::Command.id()).unwrap().collect();
        assert_eq!(cmd, ["train.py", "--lr", "0.1", "--nnodes=9"]);
    }

    #[test]
    fn module_flag_and_short_forms() {
        let m = parse(&["-m", "-t", "3", "pkg.train", "-x"]).unwrap();
        let set = set_on_command_line(&m);
        assert_eq!(set[&Opt::Module], "true");
        assert_eq!(set[&Opt::Tee], "3");
    }

    /// The installed torchrun's parser, option by option: a new torch release that
    /// adds or changes an option fails here, not in a user's job.
    #[test]
    #[ignore = "needs PyTorch: run scripts/dev/test.sh"]
    fn every_option_of_the_installed_torchrun() {
        let python = std::env::var("TOPORUN_PYTHON")
            .expect("TOPORUN_PYTHON: the venv's python (scripts/dev/test.sh sets it)");
        let script = "from torch.distributed.run import get_args_parser\nfor a in get_args_parser()._actions:\n    if a.option_strings and a.dest != 'help':\n        print(' '.join(a.option_strings), a.nargs == 0, ','.join(a.choices or []))\n";
        let out = std::process::Command::new(python)
            .args(["-c", script])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let cmd = launch_command("torchrun");
        let text = String::from_utf8(out.stdout).unwrap();
        assert!(text.lines().count() > 25, "{text}");
        for line in text.lines() {
            let parts: Vec<&str> = line.split(' ').collect();
            let (names, flag, choices) = (
                &parts[..parts.len() - 2],
                parts[parts.len() - 2] == "True",
                parts[parts.len() - 1],
            );
            for name in names {
                let arg = cmd
                    .get_arguments()
                    .find(|a| {
                        name.strip_prefix("--").is_some_and(|l| {
                            a.get_long() == Some(l)
                                || a.get_all_aliases().unwrap_or_default().contains(&l)
                        }) || name.strip_prefix('-').and_then(|c| c.chars().next()) == a.get_short()
                    })
                    .unwrap_or_else(|| panic!("torchrun option {name} missing from toporun"));
                assert_eq!(
                    !arg.get_action().takes_values(),
                    flag,
                    "{name}: flag or value"
                );
                let ours: Vec<String> = arg
                    .get_possible_values()
                    .iter()
                    .map(|v| v.get_name().to_string())
                    .collect();
                assert_eq!(ours.join(","), choices, "{name}: choices");
            }
        }
    }

    #[test]
    fn abbreviations_like_argparse() {
        let set = |args: &[&str]| set_on_command_line(&parse(args).unwrap());
        assert_eq!(set(&["--nnod", "2", "t.py"])[&Opt::Nnodes], "2");
        assert_eq!(set(&["--max-r=3", "t.py"])[&Opt::MaxRestarts], "3");
        let e = parse(&["--nproc", "2", "t.py"]).unwrap_err();
        assert_eq!(e.exit_code(), 2);
        let msg = e.to_string();
        assert!(
            msg.contains(
                "ambiguous option: --nproc could match --nproc-per-node, --nproc_per_node"
            ),
            "{msg}"
        );
        // Options after the entrypoint belong to the script.
        let m = parse(&["t.py", "--nproc", "x"]).unwrap();
        let cmd: Vec<&String> = m.get_many::<String>(Extra::Command.id()).unwrap().collect();
        assert_eq!(cmd, ["t.py", "--nproc", "x"]);
    }

    #[test]
    fn unknown_option_and_missing_script_are_usage_errors() {
        assert_eq!(parse(&["--bogus", "t.py"]).unwrap_err().exit_code(), 2);
        assert_eq!(parse(&["--nproc-per-node=2"]).unwrap_err().exit_code(), 2);
    }

    #[test]
    fn every_option_name_is_an_argument_of_the_launch_command() {
        let cmd = launch_command("torchrun");
        let ids: Vec<&str> = cmd.get_arguments().map(|a| a.get_id().as_str()).collect();
        for d in crate::toporun_options::EXTRA_OPTIONS {
            assert!(ids.contains(&d.id), "{:?} is no argument", d.extra);
        }
        for o in OPTIONS {
            assert!(ids.contains(&o.opt.dest()), "{:?} is no argument", o.opt);
        }
    }
}
