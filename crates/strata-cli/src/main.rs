//! The `strata` binary: parses the command line and hands off to the libraries.
fn main() {}
