//! toporun's own lines on stderr. A launch outlives its console: Rust ignores
//! SIGPIPE, and `eprintln!` panics once stderr's reader has gone (`toporun ... 2>&1 |
//! head`), which lost the failure summary, error file and termination message after
//! it (exit 101). Here a line written to a console that is gone is dropped.

use std::io::Write;

/// `args` and a newline on stderr, or nowhere when the console is gone.
pub fn line(args: std::fmt::Arguments) {
    let _ = writeln!(std::io::stderr(), "{args}");
}

/// `args` on stderr, or nowhere when the console is gone.
pub fn text(args: std::fmt::Arguments) {
    let _ = write!(std::io::stderr(), "{args}");
}

/// `eprintln!` that never panics.
macro_rules! say {
    ($($arg:tt)*) => {
        $crate::console::line(format_args!($($arg)*))
    };
}

/// A warning: `toporun: warning: ` and `args`, as `say!`.
macro_rules! say_warning {
    ($($arg:tt)*) => {
        $crate::console::line(format_args!("toporun: warning: {}", format_args!($($arg)*)))
    };
}

/// `eprint!` that never panics.
macro_rules! say_raw {
    ($($arg:tt)*) => {
        $crate::console::text(format_args!($($arg)*))
    };
}

pub(crate) use {say, say_raw, say_warning};
