//! toporun: a torchrun-compatible launcher that knows the GPU host and container.

mod bench_stacks;
mod cli;
mod commands;
mod console;
mod documents;
mod dry_run;
mod exit;
mod facts_source;
mod fr_trace_cmd;
mod launch;
mod log_format;
mod measure_child;
mod nccl_log_cmd;
mod output;
mod subcommands;

use std::process::ExitCode;

fn main() -> ExitCode {
    // The agent reports through tracing; show warnings and above as "toporun: ...".
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_max_level(tracing::Level::WARN)
        .with_ansi(false)
        .event_format(log_format::Prefixed)
        .init();
    // A panic inside the stack reader is caught and said there; any other is printed.
    let default_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        if !toporun_agent::stacks::in_reader() {
            default_hook(info);
        }
    }));
    let argv: Vec<String> = std::env::args().collect();
    let invoked_as = std::path::Path::new(argv.first().map(String::as_str).unwrap_or("toporun"))
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let rest = argv.get(1..).unwrap_or_default();
    let code = if invoked_as == "torchrun" || cli::is_torchrun_form(rest) {
        let name = if invoked_as == "torchrun" {
            "torchrun"
        } else {
            "toporun"
        };
        match cli::parse_launch(cli::launch_command(name), &argv) {
            Ok(m) => launch::run(&m),
            Err(e) => exit::usage(e),
        }
    } else if let Some(launch_argv) = cli::launch_form(rest) {
        // `toporun [globals] launch ...`: parsed as torchrun parses (abbreviations).
        match cli::parse_launch(cli::launch_command("launch"), &launch_argv) {
            Ok(m) => launch::run(&m),
            Err(e) => exit::usage(e),
        }
    } else {
        match cli::toporun_command().try_get_matches_from(&argv) {
            Ok(m) if m.subcommand_name() == Some("launch") => commands::launch(&m),
            Ok(m) => match <subcommands::Cli as clap::FromArgMatches>::from_arg_matches(&m) {
                Ok(parsed) => commands::dispatch(parsed),
                Err(e) => exit::usage(e),
            },
            Err(e) => exit::usage(e),
        }
    };
    ExitCode::from(code)
}
