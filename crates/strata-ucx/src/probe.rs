//! Can the UCX libraries be loaded here? Used by `strata info`.

/// Shared-library names tried, newest ABI first.
pub const UCP_LIBRARY_NAMES: &[&str] = &["libucp.so.0", "libucp.so"];

/// Returns the name of the UCP library that loads, or the loader's error for the first name.
pub fn probe() -> Result<&'static str, String> {
    let mut first_error = None;
    for name in UCP_LIBRARY_NAMES {
        // SAFETY: loading libucp runs its ELF constructors, which only initialise UCX's own
        // global state; no symbol is called here.
        match unsafe { libloading::Library::new(name) } {
            Ok(_) => return Ok(name),
            Err(e) => {
                first_error.get_or_insert_with(|| e.to_string());
            }
        }
    }
    Err(first_error.unwrap_or_default())
}
