//! Byte sizes written the way people write them: `4096`, `64KiB`, `8GiB`, `1.5 MiB`.

/// Why a size string could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SizeParseError {
    /// Nothing to parse.
    #[error(
        "empty size; write a number of bytes with an optional unit, such as 4096, 64KiB or 8GiB"
    )]
    Empty,
    /// The number part is not a number.
    #[error(
        "{0:?} is not a size; write a number of bytes with an optional unit, such as 4096, 64KiB or 8GiB"
    )]
    Malformed(String),
    /// The unit is not one we know.
    #[error(
        "{unit:?} in {input:?} is not a size unit; use B, KiB, MiB, GiB, TiB (or K, M, G, T, KB, MB, GB, TB, all powers of 1024)"
    )]
    UnknownUnit {
        /// The whole input.
        input: String,
        /// The unit part.
        unit: String,
    },
    /// The value does not fit in 64 bits or is not a whole number of bytes.
    #[error("{0:?} is not a whole number of bytes that fits in 64 bits")]
    OutOfRange(String),
}

const UNITS: &[(&str, u64)] = &[
    ("", 1),
    ("b", 1),
    ("k", 1 << 10),
    ("kb", 1 << 10),
    ("kib", 1 << 10),
    ("m", 1 << 20),
    ("mb", 1 << 20),
    ("mib", 1 << 20),
    ("g", 1 << 30),
    ("gb", 1 << 30),
    ("gib", 1 << 30),
    ("t", 1 << 40),
    ("tb", 1 << 40),
    ("tib", 1 << 40),
];

/// Parses a byte size. Units are powers of 1024 whatever their spelling (`KB` = `KiB`), because
/// page and buffer sizes are always binary; fractions are allowed when the result is whole
/// (`1.5MiB`).
pub fn parse_size(input: &str) -> Result<u64, SizeParseError> {
    let text = input.trim();
    if text.is_empty() {
        return Err(SizeParseError::Empty);
    }
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '_'))
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let number = number.replace('_', "");
    if number.is_empty() {
        return Err(SizeParseError::Malformed(input.into()));
    }
    let unit_lower = unit.trim().to_ascii_lowercase();
    let multiplier = UNITS
        .iter()
        .find(|(name, _)| *name == unit_lower)
        .map(|(_, m)| *m)
        .ok_or_else(|| SizeParseError::UnknownUnit {
            input: input.into(),
            unit: unit.trim().into(),
        })?;
    if number.is_empty() {
        return Err(SizeParseError::Malformed(input.into()));
    }
    match number.split_once('.') {
        None => number
            .parse::<u64>()
            .map_err(|_| SizeParseError::OutOfRange(input.into()))?
            .checked_mul(multiplier)
            .ok_or_else(|| SizeParseError::OutOfRange(input.into())),
        Some((whole, frac)) => {
            if frac.contains('.') || (whole.is_empty() && frac.is_empty()) {
                return Err(SizeParseError::Malformed(input.into()));
            }
            // Exact decimal arithmetic: value = (whole * 10^d + frac) * multiplier / 10^d.
            let digits =
                u32::try_from(frac.len()).map_err(|_| SizeParseError::OutOfRange(input.into()))?;
            let scale = 10u128
                .checked_pow(digits)
                .ok_or_else(|| SizeParseError::OutOfRange(input.into()))?;
            let whole: u128 = if whole.is_empty() {
                0
            } else {
                whole
                    .parse()
                    .map_err(|_| SizeParseError::OutOfRange(input.into()))?
            };
            let frac: u128 = if frac.is_empty() {
                0
            } else {
                frac.parse()
                    .map_err(|_| SizeParseError::OutOfRange(input.into()))?
            };
            let scaled = whole
                .checked_mul(scale)
                .and_then(|w| w.checked_add(frac))
                .and_then(|v| v.checked_mul(u128::from(multiplier)))
                .ok_or_else(|| SizeParseError::OutOfRange(input.into()))?;
            if scaled % scale != 0 {
                return Err(SizeParseError::OutOfRange(input.into()));
            }
            u64::try_from(scaled / scale).map_err(|_| SizeParseError::OutOfRange(input.into()))
        }
    }
}

/// Formats a byte count with the largest binary unit that keeps it readable: `4 KiB`,
/// `1.50 GiB`, `37 B`.
pub fn format_size(bytes: u64) -> String {
    const NAMES: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut unit = 0;
    while unit + 1 < NAMES.len() && bytes >= 1u64 << (10 * (unit + 1)) {
        unit += 1;
    }
    let divisor = 1u64 << (10 * unit);
    if bytes.is_multiple_of(divisor) {
        format!("{} {}", bytes / divisor, NAMES[unit])
    } else {
        #[allow(clippy::cast_precision_loss)] // display only
        let value = bytes as f64 / divisor as f64;
        format!("{value:.2} {}", NAMES[unit])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_plain_and_binary_units() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("64KiB"), Ok(65536));
        assert_eq!(parse_size("64 kib"), Ok(65536));
        assert_eq!(parse_size("8GiB"), Ok(8 << 30));
        assert_eq!(parse_size("2M"), Ok(2 << 20));
        assert_eq!(parse_size("1.5MiB"), Ok(3 << 19));
        assert_eq!(parse_size("1_024"), Ok(1024));
        assert_eq!(parse_size("16TiB"), Ok(16 << 40));
    }

    #[test]
    fn rejects_bad_sizes() {
        assert_eq!(parse_size(""), Err(SizeParseError::Empty));
        assert!(matches!(
            parse_size("lots"),
            Err(SizeParseError::Malformed(_))
        ));
        assert!(matches!(
            parse_size("12 parsecs"),
            Err(SizeParseError::UnknownUnit { .. })
        ));
        assert!(matches!(
            parse_size("1.1.1K"),
            Err(SizeParseError::Malformed(_))
        ));
        assert!(matches!(
            parse_size("0.3B"),
            Err(SizeParseError::OutOfRange(_))
        ));
        assert!(matches!(
            parse_size("99999999999TiB"),
            Err(SizeParseError::OutOfRange(_))
        ));
        assert!(matches!(
            parse_size("18446744073709551616"),
            Err(SizeParseError::OutOfRange(_))
        ));
        assert!(matches!(
            parse_size("-4K"),
            Err(SizeParseError::Malformed(_))
        ));
        assert!(matches!(
            parse_size("4 KiBB"),
            Err(SizeParseError::UnknownUnit { .. })
        ));
    }

    #[test]
    fn formats_round_trip_for_whole_units() {
        for bytes in [0, 1, 4096, 65536, 2 << 20, 8 << 30] {
            assert_eq!(parse_size(&format_size(bytes).replace(' ', "")), Ok(bytes));
        }
        assert_eq!(format_size(1536), "1.50 KiB");
    }
}
