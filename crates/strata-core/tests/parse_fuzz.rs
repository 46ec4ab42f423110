//! Bounded fuzzing (256 cases per property by default; `PROPTEST_CASES` for more) of the two
//! parsers that read user text: byte sizes (`units`) and `STRATA_*` settings (`config`).
//! Neither may panic on any input; what they accept must mean exactly what it says, and what
//! they refuse must be refused with an error that names the input.

use proptest::prelude::*;
use strata_core::config::{
    ConfigError, EnvVars, KNOWN_VARIABLES, PagerConfig, PagerConfigBuilder, SpaceConfig,
    StoreConfig,
};
use strata_core::units::{SizeParseError, format_size, parse_size};

/// Every unit spelling and its multiplier (all binary, whatever the spelling): bytes as ""
/// or "b", and each of k, m, g, t alone or followed by "b" or "ib".
fn units() -> Vec<(String, u64)> {
    let mut all = vec![(String::new(), 1), ("b".to_string(), 1)];
    for (i, prefix) in ["k", "m", "g", "t"].into_iter().enumerate() {
        for suffix in ["", "b", "ib"] {
            all.push((format!("{prefix}{suffix}"), 1u64 << (10 * (i + 1))));
        }
    }
    all
}

fn unit() -> impl Strategy<Value = (String, u64)> {
    prop::sample::select(units())
}

/// Text built from the characters size strings are made of, plus a few that are not.
fn size_like() -> impl Strategy<Value = String> {
    let chars: Vec<char> = "0123456789._ -+eEkKmMgGtTbBiI\u{e9}\u{663}\t"
        .chars()
        .collect();
    prop::collection::vec(prop::sample::select(chars), 0..40).prop_map(String::from_iter)
}

/// `unit` with each letter's case chosen by the bits of `case`.
fn spell(unit: &str, case: u8) -> String {
    unit.chars()
        .enumerate()
        .map(|(i, c)| {
            if case >> (i % 8) & 1 == 1 {
                c.to_ascii_uppercase()
            } else {
                c
            }
        })
        .collect()
}

fn env(pairs: &[(String, String)]) -> EnvVars {
    pairs.to_vec()
}

fn known_name() -> impl Strategy<Value = String> {
    prop::sample::select(
        KNOWN_VARIABLES
            .iter()
            .map(|(k, _)| (*k).to_string())
            .collect::<Vec<_>>(),
    )
}

/// Values of the shapes settings take, and noise.
fn setting_value() -> impl Strategy<Value = String> {
    prop_oneof![
        any::<String>(),
        size_like(),
        any::<u64>().prop_map(|v| v.to_string()),
        any::<i64>().prop_map(|v| format!(" {v} ")),
        prop::sample::select(vec![
            "true",
            "FALSE",
            "yes",
            "off",
            "maybe",
            "memory",
            "file:",
            "file:/x",
            "remote:h:1",
            "remote:h:99999",
            "none",
            "lz4",
            "zfp:1e-6",
            "zfp:0",
            "zfp:nan",
            "zfp:inf",
            "4KiB",
            "2MiB",
            "0",
            "1025",
        ])
        .prop_map(str::to_string),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { failure_persistence: None, ..ProptestConfig::default() })]

    /// No text makes the size parser panic; every error names the input.
    #[test]
    fn any_text_is_a_size_or_a_clear_error(text in prop_oneof![any::<String>(), size_like()]) {
        match parse_size(&text) {
            Ok(_) => {}
            Err(SizeParseError::Empty) => prop_assert!(text.trim().is_empty()),
            Err(e) => prop_assert!(e.to_string().contains(&format!("{:?}", text)), "{}", e),
        }
    }

    /// A whole number with any unit spelling, in any case, with spaces and digit separators,
    /// is that number times the unit, or OutOfRange exactly when that overflows.
    #[test]
    fn whole_sizes_mean_what_they_say(
        value in prop_oneof![any::<u64>(), 0u64..100_000],
        (name, multiplier) in unit(),
        case in any::<u8>(),
        space in prop::sample::select(vec!["", " ", "  "]),
        separator in any::<bool>(),
    ) {
        let mut digits = value.to_string();
        if separator && digits.len() > 3 {
            digits.insert(digits.len() - 3, '_');
        }
        let text = format!(" {digits}{space}{} ", spell(&name, case));
        match value.checked_mul(multiplier) {
            Some(bytes) => prop_assert_eq!(parse_size(&text), Ok(bytes)),
            None => prop_assert_eq!(parse_size(&text), Err(SizeParseError::OutOfRange(text.clone()))),
        }
    }

    /// A fraction is accepted exactly when it names a whole number of bytes that fits, and
    /// then it is that number.
    #[test]
    fn fractional_sizes_are_exact(
        whole in prop_oneof![0u64..10_000, any::<u64>()],
        fraction in "[0-9]{0,30}".prop_map(|s: String| s),
        (name, multiplier) in unit(),
    ) {
        let text = format!("{whole}.{fraction}{name}");
        // value * 10^d == (whole * 10^d + fraction) * multiplier, in exact arithmetic.
        let digits = u32::try_from(fraction.len()).unwrap();
        let scaled = 10u128.checked_pow(digits).and_then(|scale| {
            let numerator = u128::from(whole)
                .checked_mul(scale)?
                .checked_add(if fraction.is_empty() { 0 } else { fraction.parse().ok()? })?
                .checked_mul(u128::from(multiplier))?;
            Some((numerator, scale))
        });
        let exact = scaled.and_then(|(numerator, scale)| {
            (numerator % scale == 0).then(|| u64::try_from(numerator / scale).ok()).flatten()
        });
        match (parse_size(&text), exact) {
            (Ok(v), Some(e)) => prop_assert_eq!(v, e),
            (Err(SizeParseError::OutOfRange(_)), None) => {}
            (got, want) => prop_assert!(false, "{}: parsed {:?}, exact value {:?}", text, got, want),
        }
    }

    /// What `format_size` prints for a whole number of units reads back as the same size.
    #[test]
    fn formatted_sizes_read_back(count in 0u64..(1 << 20), shift in prop::sample::select(vec![0u32, 10, 20, 30, 40])) {
        let bytes = count << shift;
        prop_assume!(bytes >> shift == count);
        let text = format_size(bytes);
        if !text.contains('.') {
            prop_assert_eq!(parse_size(&text.replace(' ', "")), Ok(bytes), "{}", text);
        }
    }

    /// Any set of STRATA_* variables with any values: every builder either applies them or
    /// says which variable is wrong; none panics, in `with_env_vars` or in `build`.
    #[test]
    fn any_strata_environment_is_applied_or_refused_by_name(
        vars in prop::collection::vec(
            (prop_oneof![
                4 => known_name(),
                1 => "STRATA_[A-Z_]{0,20}".prop_map(|s: String| s),
            ], setting_value()),
            0..6,
        ),
    ) {
        let vars = env(&vars);
        let outcomes = [
            SpaceConfig::builder().with_env_vars(&vars).and_then(|b| b.build().map(|_| ())),
            PagerConfig::builder().with_env_vars(&vars).and_then(|b| b.build().map(|_| ())),
            StoreConfig::builder().with_env_vars(&vars).and_then(|b| b.build().map(|_| ())),
        ];
        for outcome in outcomes {
            if let Err(e) = outcome {
                let message = e.to_string();
                prop_assert!(!message.is_empty());
                match &e {
                    ConfigError::BadEnv { name, .. } | ConfigError::UnknownEnv { name, .. } => {
                        prop_assert!(message.contains(name.as_str()), "{}", message);
                        prop_assert!(name == "STRATA_REMOTE_TIMEOUT" || vars.iter().any(|(k, _)| k == name));
                    }
                    _ => {}
                }
            }
        }
    }

    /// Numeric settings read exactly the number written (surrounding spaces allowed), and
    /// thread counts outside 1..=1024 are refused.
    #[test]
    fn thread_counts_from_the_environment(value in prop_oneof![0u64..2000, any::<u64>()], pad in any::<bool>()) {
        let text = if pad { format!(" {value}\t") } else { value.to_string() };
        let vars = env(&[("STRATA_FILLERS".into(), text)]);
        let built = PagerConfig::builder().with_env_vars(&vars).and_then(PagerConfigBuilder::build);
        match usize::try_from(value) {
            Ok(n) if (1..=1024).contains(&n) => prop_assert_eq!(built.map(|c| c.fillers), Ok(n)),
            Ok(n) => {
                let refused = matches!(built, Err(ConfigError::ThreadCount { what: "fillers", value, .. }) if value == n);
                prop_assert!(refused);
            }
            Err(_) => {
                let refused = matches!(&built, Err(ConfigError::BadEnv { name, .. }) if name == "STRATA_FILLERS");
                prop_assert!(refused);
            }
        }
    }

    /// Sizes from the environment follow `parse_size` exactly.
    #[test]
    fn sizes_from_the_environment(text in prop_oneof![size_like(), (1u64..4096, unit()).prop_map(|(v, (u, _))| format!("{v}{u}"))]) {
        let vars = env(&[("STRATA_BUFFER_SIZE".into(), text.clone())]);
        let builder = PagerConfig::builder().with_env_vars(&vars);
        match parse_size(&text) {
            Ok(_) => prop_assert!(builder.is_ok()),
            Err(e) => {
                let Err(ConfigError::BadEnv { name, reason, .. }) = builder else {
                    return Err(TestCaseError::fail(format!("{text:?} accepted")));
                };
                prop_assert_eq!(name, "STRATA_BUFFER_SIZE");
                prop_assert_eq!(reason, e.to_string());
            }
        }
    }
}
