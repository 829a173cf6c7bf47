//! `Debug` for types that hold a secret: it lists the fields it may show, so a field
//! added later stays hidden until someone decides it is not a secret.

/// `debug_showing!(Type: shown, fields)`: `Debug` printing only the named fields,
/// and `..` for the rest.
macro_rules! debug_showing {
    ($type:ident: $($field:ident),* $(,)?) => {
        impl std::fmt::Debug for $type {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.debug_struct(stringify!($type))
                    $(.field(stringify!($field), &self.$field))*
                    .finish_non_exhaustive()
            }
        }
    };
}

pub(crate) use debug_showing;
