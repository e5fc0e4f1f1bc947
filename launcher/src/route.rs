//! How argv reaches a command: `torchrun ...` (through the symlink), `toporun
//! [globals] SCRIPT ...` and `toporun [globals] launch ...` launch; anything else is
//! one of toporun's subcommands, a misspelt one named as such.

use crate::cli::{launch_command, parse_launch, toporun_command, SUBCOMMANDS};
use crate::subcommands::Cli;
use clap::ArgMatches;

/// What a command line asks for, parsed: every form reaches one of these two.
pub enum Invocation {
    /// `torchrun ...`, `toporun [globals] SCRIPT ...` or `toporun [globals] launch ...`,
    /// parsed as torchrun's argparse parses (abbreviations, a dash-led entrypoint).
    Launch(ArgMatches),
    /// One of toporun's own subcommands.
    Subcommand(Cli),
}

/// Routes and parses argv (the program name first): the one way in.
pub fn route(argv: &[String]) -> Result<Invocation, clap::Error> {
    let program = argv.first().map(String::as_str).unwrap_or("toporun");
    let as_torchrun = std::path::Path::new(program)
        .file_name()
        .is_some_and(|n| n == "torchrun");
    let rest = argv.get(1..).unwrap_or_default();
    let at = globals_end(rest);
    let first = rest.get(at).map(String::as_str);
    let launch = |name, argv: &[String]| parse_launch(launch_command(name), argv);
    if as_torchrun {
        return launch("torchrun", argv).map(Invocation::Launch);
    }
    match first {
        // `[globals] launch ARGS` as `launch [globals] ARGS`.
        Some("launch") => {
            let argv: Vec<String> = std::iter::once("launch".to_string())
                .chain(rest[..at].iter().cloned())
                .chain(rest[at + 1..].iter().cloned())
                .collect();
            launch("launch", &argv).map(Invocation::Launch)
        }
        Some(a) if mistyped_subcommand(a).is_some() => {
            let near = mistyped_subcommand(a).unwrap_or_default();
            Err(toporun_command().error(
                clap::error::ErrorKind::InvalidSubcommand,
                format!("unrecognized subcommand '{a}'; did you mean '{near}'? (a training script is run as `toporun train.py`, and no file '{a}' is here)"),
            ))
        }
        Some(a)
            if !SUBCOMMANDS.contains(&a) && !matches!(a, "-h" | "--help" | "-V" | "--version") =>
        {
            launch("toporun", argv).map(Invocation::Launch)
        }
        _ => {
            use clap::FromArgMatches;
            let m = toporun_command().try_get_matches_from(argv)?;
            Cli::from_arg_matches(&m).map(Invocation::Subcommand)
        }
    }
}

/// Where the leading global options (`--facts FILE`, `--nvidia-smi-topo FILE`, or
/// their `=` forms: the subcommands' `Globals`) of argv after the program name end.
fn globals_end(args: &[String]) -> usize {
    use clap::Args;
    let globals = crate::subcommands::Globals::augment_args(clap::Command::new("globals"));
    let longs: Vec<String> = globals
        .get_arguments()
        .filter_map(|a| a.get_long())
        .map(|l| format!("--{l}"))
        .collect();
    let mut i = 0;
    while let Some(a) = args.get(i).map(String::as_str) {
        if longs.iter().any(|l| l == a) {
            i += 2;
        } else if longs.iter().any(|l| a.starts_with(&format!("{l}="))) {
            i += 1;
        } else {
            break;
        }
    }
    i.min(args.len())
}

/// The subcommand `a` most likely misspells (`lauch`), where `a` is no file here and
/// no path or module: `toporun lauch x.py` would otherwise run `lauch` as the script.
fn mistyped_subcommand(a: &str) -> Option<&'static str> {
    if SUBCOMMANDS.contains(&a)
        || a.len() < 3
        || a.starts_with('-')
        || a.contains(['.', '/'])
        || std::path::Path::new(a).exists()
    {
        return None;
    }
    SUBCOMMANDS
        .iter()
        .copied()
        .filter(|s| strsim::levenshtein(a, s) <= 2 && s.len() >= 3)
        .min_by_key(|s| strsim::levenshtein(a, s))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::Extra;
    use toporun_shared::torchrun::Opt;

    #[test]
    fn every_form_takes_one_route() {
        let v = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let launched = |a: &[&str]| match route(&v(a)) {
            Ok(Invocation::Launch(m)) => {
                let script = m
                    .get_many::<String>(Extra::Command.id())
                    .unwrap()
                    .next()
                    .unwrap();
                Some((
                    script.clone(),
                    m.get_one::<String>(Opt::NprocPerNode.dest()).cloned(),
                ))
            }
            Ok(Invocation::Subcommand(_)) => None,
            Err(e) => panic!("{a:?}: {e}"),
        };
        let t = |n: &str| Some(("train.py".to_string(), Some(n.to_string())));
        assert_eq!(
            launched(&["toporun", "--nproc-per-node=2", "train.py"]),
            t("2")
        );
        assert_eq!(
            launched(&["/usr/bin/torchrun", "--nproc_per", "3", "train.py"]),
            t("3")
        );
        // Globals before `launch` move after it.
        let l = [
            "toporun",
            "--facts",
            "f.json",
            "launch",
            "--nproc-per-node",
            "4",
            "train.py",
        ];
        assert_eq!(launched(&l), t("4"));
        assert_eq!(launched(&["toporun", "--facts=f.json", "preflight"]), None);
        assert_eq!(launched(&["toporun", "topo"]), None);
        // A torchrun with a subcommand's name as its script still launches it.
        let probe = route(&v(&["torchrun", "probe"])).unwrap();
        assert!(matches!(probe, Invocation::Launch(_)));
        for usage in [
            &["toporun", "--bogus"][..],
            &["toporun", "--facts"],
            &["toporun", "launch"],
        ] {
            let e = route(&v(usage))
                .err()
                .unwrap_or_else(|| panic!("{usage:?}"));
            assert_eq!(e.exit_code(), 2, "{usage:?}: {e}");
        }
        // A misspelt subcommand is named, not run as the training script; a script
        // named like one, or a file here, still runs.
        let e = route(&v(&["toporun", "lauch", "x.py"]))
            .err()
            .expect("refused");
        assert_eq!(e.exit_code(), 2);
        assert!(e.to_string().contains("did you mean 'launch'?"), "{e}");
        assert!(route(&v(&["toporun", "preflght"])).is_err());
        assert_eq!(
            launched(&["toporun", "lauch.py"]).map(|l| l.0),
            Some("lauch.py".to_string())
        );
        assert!(launched(&["toporun", "python3"]).is_some());
        assert_eq!(
            globals_end(&v(&["--facts", "f", "--nvidia-smi-topo=t", "x"])),
            3
        );
    }
}
