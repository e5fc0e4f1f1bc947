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
mod profiler_plugin;
mod route;
mod subcommands;
mod text_env;
mod toporun_options;

use std::process::ExitCode;

fn main() -> ExitCode {
    // The agent reports through tracing; show warnings and above as "toporun: ...".
    // A console gone (`toporun ... 2>&1 | head`) drops the line: tracing's own report
    // of the failed write is an eprintln!, which would panic (exit 101).
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .log_internal_errors(false)
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
    let argv = match text_env::arguments() {
        Ok(a) => a,
        Err(e) => {
            console::say!("toporun: error: {e}");
            return ExitCode::from(exit::ExitStatus::Clap(2));
        }
    };
    let code = match route::route(&argv) {
        Ok(route::Invocation::Launch(m)) => launch::run(&m),
        Ok(route::Invocation::Subcommand(c)) => commands::dispatch(c),
        Err(e) => exit::usage(e),
    };
    ExitCode::from(code)
}
