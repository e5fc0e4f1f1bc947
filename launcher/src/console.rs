//! The launcher's own lines on stderr, through the agent's writer that never panics
//! (`toporun_agent::console`: a console gone drops the line).

/// `eprintln!` that never panics.
macro_rules! say {
    ($($arg:tt)*) => {
        toporun_agent::console::line(format_args!($($arg)*))
    };
}

/// `eprint!` that never panics.
macro_rules! say_raw {
    ($($arg:tt)*) => {
        toporun_agent::console::text(format_args!($($arg)*))
    };
}

pub(crate) use {say, say_raw};
