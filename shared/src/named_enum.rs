//! One enum of named constants, each with its string: the finding ids, the `TOPORUN_*`
//! variables. `$text` names the variant's string accessor.

macro_rules! named_enum {
    ($(#[$doc:meta])* $name:ident, $text:ident { $($variant:ident => $s:literal,)+ }) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
        pub enum $name {
            $($variant,)+
        }

        impl $name {
            /// Every one, in the table's order.
            pub const ALL: &'static [$name] = &[$($name::$variant,)+];

            pub const fn $text(self) -> &'static str {
                match self {
                    $($name::$variant => $s,)+
                }
            }
        }
    };
}

pub(crate) use named_enum;
