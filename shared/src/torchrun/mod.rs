//! torchrun's contract: its options (with PET_* precedence), rendezvous endpoints,
//! and the environment and command line every worker gets.

pub mod endpoint;
pub mod interpreter;
pub mod line_filters;
pub mod option_table;
pub mod options;
pub mod rdzv_conf;
pub mod std_spec;
pub mod values;
pub mod worker;

pub use options::{
    resolve, seconds, LaunchOptions, NprocSpec, Opt, OptionDef, OptionsError, RdzvBackend,
    MAX_NODES, MAX_NPROC, MAX_WORLD, OPTIONS,
};
pub use rdzv_conf::{EtcdProtocol, RdzvConf};
