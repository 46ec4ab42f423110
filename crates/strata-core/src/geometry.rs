//! Page geometry: page sizes and the arithmetic between byte offsets and page indices over
//! 64-bit spaces. Every conversion that could overflow is checked.

use std::fmt;
use std::ops::Range;

use crate::units::format_size;

/// Smallest page size Strata supports (the x86-64 base page).
pub const MIN_PAGE_SIZE: u64 = 4 << 10;
/// Largest page size Strata supports (an x86-64 huge page).
pub const MAX_PAGE_SIZE: u64 = 2 << 20;

/// Why a geometry could not be built or a conversion failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GeometryError {
    /// The page size is not a power of two in `[4 KiB, 2 MiB]`.
    #[error(
        "page size {0} is not a power of two between 4 KiB and 2 MiB; use 4KiB, 8KiB, ..., 2MiB"
    )]
    BadPageSize(u64),
    /// A space must hold at least one byte.
    #[error("a space of 0 bytes holds nothing; give a size of at least one byte")]
    EmptySpace,
    /// An offset or page index lies outside the space.
    #[error("{what} {value} is outside a space of {limit}; stay below it")]
    OutOfSpace {
        /// `offset`, `page` or `range end`.
        what: &'static str,
        /// The offending value.
        value: u64,
        /// The space's bound in the same unit, formatted.
        limit: String,
    },
}

/// A validated page size: a power of two from 4 KiB to 2 MiB.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
#[serde(into = "u64")]
pub struct PageSize(u32);

impl PageSize {
    /// 4 KiB.
    pub const KIB4: PageSize = PageSize(4 << 10);
    /// 64 KiB.
    pub const KIB64: PageSize = PageSize(64 << 10);
    /// 2 MiB.
    pub const MIB2: PageSize = PageSize(2 << 20);

    /// Validates `bytes` as a page size.
    pub fn new(bytes: u64) -> Result<Self, GeometryError> {
        if bytes.is_power_of_two() && (MIN_PAGE_SIZE..=MAX_PAGE_SIZE).contains(&bytes) {
            // At most 2 MiB, so it fits in u32.
            Ok(PageSize(
                u32::try_from(bytes).map_err(|_| GeometryError::BadPageSize(bytes))?,
            ))
        } else {
            Err(GeometryError::BadPageSize(bytes))
        }
    }

    /// The size in bytes.
    pub fn bytes(self) -> u64 {
        u64::from(self.0)
    }

    /// The size in bytes as `usize` (always fits: at most 2 MiB).
    pub fn bytes_usize(self) -> usize {
        self.0 as usize
    }

    /// log2 of the size (12 for 4 KiB).
    pub fn shift(self) -> u32 {
        self.0.trailing_zeros()
    }
}

impl From<PageSize> for u64 {
    fn from(p: PageSize) -> u64 {
        p.bytes()
    }
}

impl fmt::Display for PageSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&format_size(self.bytes()))
    }
}

/// A byte space of `size` bytes cut into pages of `page_size`. The last page may be partial.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct SpaceGeometry {
    size: u64,
    page_size: PageSize,
}

impl SpaceGeometry {
    /// A space of `size` bytes (at least 1) in pages of `page_size`.
    pub fn new(size: u64, page_size: PageSize) -> Result<Self, GeometryError> {
        if size == 0 {
            return Err(GeometryError::EmptySpace);
        }
        Ok(Self { size, page_size })
    }

    /// The space's size in bytes.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// The page size.
    pub fn page_size(&self) -> PageSize {
        self.page_size
    }

    /// Number of pages, counting a partial last page.
    pub fn page_count(&self) -> u64 {
        // size >= 1, so this cannot overflow (unlike `(size + page - 1) / page`).
        self.size.div_ceil(self.page_size.bytes())
    }

    /// The page holding byte `offset`.
    pub fn page_of(&self, offset: u64) -> Result<u64, GeometryError> {
        if offset >= self.size {
            return Err(self.outside("offset", offset, self.size));
        }
        Ok(offset >> self.page_size.shift())
    }

    /// Offset of `offset` within its page.
    pub fn offset_in_page(&self, offset: u64) -> u64 {
        offset & (self.page_size.bytes() - 1)
    }

    /// First byte of `page`.
    pub fn page_start(&self, page: u64) -> Result<u64, GeometryError> {
        if page >= self.page_count() {
            return Err(self.outside("page", page, self.page_count()));
        }
        Ok(page << self.page_size.shift())
    }

    /// Bytes in `page`: the page size, except for a partial last page.
    pub fn page_len(&self, page: u64) -> Result<u64, GeometryError> {
        let start = self.page_start(page)?;
        Ok((self.size - start).min(self.page_size.bytes()))
    }

    /// The byte range of `page`.
    pub fn page_range(&self, page: u64) -> Result<Range<u64>, GeometryError> {
        let start = self.page_start(page)?;
        Ok(start..start + self.page_len(page)?)
    }

    /// The pages touched by the byte range `bytes` (empty for an empty range).
    pub fn pages_of(&self, bytes: Range<u64>) -> Result<Range<u64>, GeometryError> {
        if bytes.end > self.size {
            return Err(self.outside("range end", bytes.end, self.size));
        }
        if bytes.start >= bytes.end {
            return Ok(0..0);
        }
        let first = bytes.start >> self.page_size.shift();
        let last = (bytes.end - 1) >> self.page_size.shift();
        Ok(first..last + 1)
    }

    fn outside(&self, what: &'static str, value: u64, limit: u64) -> GeometryError {
        let limit = if what == "page" {
            format!("{limit} pages")
        } else {
            format_size(limit)
        };
        GeometryError::OutOfSpace { what, value, limit }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn page_size_accepts_powers_of_two_in_range_only() {
        for shift in 12..=21 {
            assert_eq!(PageSize::new(1 << shift).unwrap().shift(), shift);
        }
        for bad in [
            0,
            1,
            2048,
            3000,
            4095,
            4097,
            12288,
            4 << 20,
            u64::MAX,
            1 << 63,
        ] {
            assert_eq!(
                PageSize::new(bad),
                Err(GeometryError::BadPageSize(bad)),
                "{bad}"
            );
        }
        let message = PageSize::new(3000).unwrap_err().to_string();
        assert!(
            message.contains("3000 is not a power of two between 4 KiB and 2 MiB"),
            "{message}"
        );
    }

    #[test]
    fn last_partial_page() {
        let g = SpaceGeometry::new(10_000, PageSize::KIB4).unwrap();
        assert_eq!(g.page_count(), 3);
        assert_eq!(g.page_len(0), Ok(4096));
        assert_eq!(g.page_len(2), Ok(10_000 - 8192));
        assert_eq!(g.page_range(2), Ok(8192..10_000));
        assert!(g.page_len(3).is_err());
        assert_eq!(g.page_of(9_999), Ok(2));
        assert!(g.page_of(10_000).is_err());
        assert_eq!(g.pages_of(4095..4097), Ok(0..2));
        assert_eq!(g.pages_of(4096..4096), Ok(0..0));
        assert_eq!(g.pages_of(0..10_000), Ok(0..3));
        assert!(g.pages_of(0..10_001).is_err());
        assert_eq!(g.offset_in_page(8193), 1);
    }

    #[test]
    fn exact_multiple_has_no_partial_page() {
        let g = SpaceGeometry::new(64 << 10, PageSize::KIB64).unwrap();
        assert_eq!(g.page_count(), 1);
        assert_eq!(g.page_len(0), Ok(64 << 10));
    }

    #[test]
    fn huge_spaces_do_not_overflow() {
        for size in [1 << 63, u64::MAX, u64::MAX - 1] {
            let g = SpaceGeometry::new(size, PageSize::MIB2).unwrap();
            let pages = g.page_count();
            assert_eq!(pages, size.div_ceil(2 << 20));
            let last = pages - 1;
            let range = g.page_range(last).unwrap();
            assert_eq!(range.end, size);
            assert_eq!(g.page_of(size - 1), Ok(last));
            assert_eq!(g.pages_of(0..size), Ok(0..pages));
            assert!(g.page_start(pages).is_err());
        }
        let g = SpaceGeometry::new(u64::MAX, PageSize::KIB4).unwrap();
        assert_eq!(g.page_len(g.page_count() - 1), Ok(4095));
    }

    #[test]
    fn zero_and_one_byte_spaces() {
        assert_eq!(
            SpaceGeometry::new(0, PageSize::KIB4),
            Err(GeometryError::EmptySpace)
        );
        let g = SpaceGeometry::new(1, PageSize::MIB2).unwrap();
        assert_eq!(g.page_count(), 1);
        assert_eq!(g.page_len(0), Ok(1));
        assert_eq!(g.pages_of(0..0), Ok(0..0));
    }
}
