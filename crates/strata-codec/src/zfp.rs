//! ZFP (lossy floating-point compression) from Debian's `libzfp.so.1`, loaded at run time
//! with hand-written declarations of the few functions used. Loaded lazily so hosts without
//! libzfp run everything but the ZFP codec.

use std::ffi::{c_int, c_void};
use std::sync::{Arc, OnceLock};

/// `zfp_type` values (zfp.h).
const ZFP_TYPE_FLOAT: c_int = 3;
const ZFP_TYPE_DOUBLE: c_int = 4;

#[repr(C)]
struct ZfpStream {
    _private: [u8; 0],
}
#[repr(C)]
struct ZfpField {
    _private: [u8; 0],
}
#[repr(C)]
struct BitStream {
    _private: [u8; 0],
}

/// The ZFP functions Strata calls (zfp 1.0 C API; all arguments are opaque pointers or
/// scalars, so no struct layout is involved).
struct ZfpApi {
    stream_open: unsafe extern "C" fn(*mut c_void, usize) -> *mut BitStream,
    stream_close: unsafe extern "C" fn(*mut BitStream),
    zfp_stream_open: unsafe extern "C" fn(*mut BitStream) -> *mut ZfpStream,
    zfp_stream_close: unsafe extern "C" fn(*mut ZfpStream),
    zfp_stream_set_accuracy: unsafe extern "C" fn(*mut ZfpStream, f64) -> f64,
    zfp_stream_maximum_size: unsafe extern "C" fn(*const ZfpStream, *const ZfpField) -> usize,
    zfp_stream_set_bit_stream: unsafe extern "C" fn(*mut ZfpStream, *mut BitStream),
    zfp_stream_rewind: unsafe extern "C" fn(*mut ZfpStream),
    zfp_field_1d: unsafe extern "C" fn(*mut c_void, c_int, usize) -> *mut ZfpField,
    zfp_field_free: unsafe extern "C" fn(*mut ZfpField),
    zfp_compress: unsafe extern "C" fn(*mut ZfpStream, *const ZfpField) -> usize,
    zfp_decompress: unsafe extern "C" fn(*mut ZfpStream, *mut ZfpField) -> usize,
    _library: libloading::Library,
}

/// Element type of a ZFP page.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ZfpElement {
    /// `f64` values.
    F64,
    /// `f32` values.
    F32,
}

impl ZfpElement {
    pub(crate) fn bytes(self) -> usize {
        match self {
            ZfpElement::F64 => 8,
            ZfpElement::F32 => 4,
        }
    }
    fn zfp_type(self) -> c_int {
        match self {
            ZfpElement::F64 => ZFP_TYPE_DOUBLE,
            ZfpElement::F32 => ZFP_TYPE_FLOAT,
        }
    }
}

/// A loaded libzfp.
#[derive(Clone)]
pub struct Zfp {
    api: Arc<ZfpApi>,
}

impl std::fmt::Debug for Zfp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Zfp")
    }
}

impl Zfp {
    /// Loads libzfp once per process.
    pub fn load() -> Result<Self, String> {
        static API: OnceLock<Result<Arc<ZfpApi>, String>> = OnceLock::new();
        let api = API
            .get_or_init(|| load_from(&["libzfp.so.1", "libzfp.so"]).map(Arc::new))
            .clone()?;
        Ok(Self { api })
    }

    /// Compresses `values` (a whole page of `element`s, as bytes) within absolute error
    /// `tolerance`. Returns `None` if ZFP produced nothing (treated as incompressible).
    pub fn compress(&self, element: ZfpElement, page: &[u8], tolerance: f64) -> Option<Vec<u8>> {
        let count = page.len() / element.bytes();
        // ZFP reads the input as an aligned array; copy into an aligned buffer.
        let mut input = vec![0u64; page.len().div_ceil(8)];
        as_bytes_mut(&mut input)[..page.len()].copy_from_slice(page);
        let mut session = Session::open(&self.api, &mut input, element, count, tolerance)?;
        let mut output = vec![0u64; session.maximum_size().div_ceil(8)];
        let written = session.compress_into(&mut output);
        if written == 0 {
            return None;
        }
        let mut bytes = as_bytes_mut(&mut output).to_vec();
        bytes.truncate(written);
        Some(bytes)
    }

    /// Decompresses `compressed` into `page` (a whole page of `element`s), encoded with
    /// absolute error bound `tolerance`.
    ///
    /// The stream must decode to exactly its own length: libzfp does not know where its input
    /// ends, so a truncated stream would make it read on past the end (and a padded one would
    /// leave bytes unread). The input is therefore copied into a buffer as large as the largest
    /// stream ZFP could read for this page ([`Zfp::maximum_size`], a bound on the bits the
    /// decoder consumes whatever the bits say) and the bytes ZFP consumed are then compared
    /// with the stream's length.
    ///
    /// # Errors
    /// A tolerance that is not a positive finite number, a stream longer than any this page
    /// can have, or one that decodes to more or fewer bytes than it holds.
    pub fn decompress(
        &self,
        element: ZfpElement,
        compressed: &[u8],
        tolerance: f64,
        page: &mut [u8],
    ) -> Result<(), ZfpDecodeError> {
        if !(tolerance.is_finite() && tolerance > 0.0) {
            return Err(ZfpDecodeError::Tolerance(tolerance));
        }
        let count = page.len() / element.bytes();
        let mut output = vec![0u64; page.len().div_ceil(8)];
        let mut session = Session::open(&self.api, &mut output, element, count, tolerance)
            .ok_or(ZfpDecodeError::OutOfMemory)?;
        let maximum = session.maximum_size();
        if compressed.len() > maximum {
            return Err(ZfpDecodeError::TooLong {
                length: compressed.len(),
                maximum,
            });
        }
        // One spare zero word beyond the maximum, so even a read ZFP makes at the very end of
        // the largest stream stays inside the buffer.
        let mut input = vec![0u64; maximum.div_ceil(8) + 1];
        as_bytes_mut(&mut input)[..compressed.len()].copy_from_slice(compressed);
        let consumed = session.decompress_from(&mut input);
        drop(session);
        if consumed != compressed.len() {
            return Err(ZfpDecodeError::Length {
                length: compressed.len(),
                consumed,
            });
        }
        page.copy_from_slice(&as_bytes_mut(&mut output)[..page.len()]);
        Ok(())
    }

    /// The largest stream, in bytes, that ZFP writes for `count` elements at `tolerance`, and
    /// so the most it reads back when decoding them, whatever the stream holds: its decoder
    /// spends at most 1 (zero block) + exponent bits + 3 group-test bits + 4 bits per bit
    /// plane on each block of four values, the count `zfp_stream_maximum_size` reports. The
    /// fuzz tests check this bound against what the decoder consumes on random streams.
    pub fn maximum_size(&self, element: ZfpElement, count: usize, tolerance: f64) -> usize {
        // The field only describes a shape here; nothing is read through its pointer.
        let mut scratch = vec![0u64; (count * element.bytes()).div_ceil(8)];
        Session::open(&self.api, &mut scratch, element, count, tolerance)
            .map_or(0, |s| s.maximum_size())
    }
}

/// A libzfp stream in fixed-accuracy mode and the field of values it encodes or decodes,
/// freed on drop. The field points into `values`, borrowed for the session's life.
struct Session<'a> {
    api: &'a ZfpApi,
    field: *mut ZfpField,
    zfp: *mut ZfpStream,
    _values: std::marker::PhantomData<&'a mut [u64]>,
}

impl<'a> Session<'a> {
    /// `None` if libzfp cannot allocate. Panics if `values` is shorter than `count` elements.
    fn open(
        api: &'a ZfpApi,
        values: &'a mut [u64],
        element: ZfpElement,
        count: usize,
        tolerance: f64,
    ) -> Option<Self> {
        assert!(
            count * element.bytes() <= values.len() * 8,
            "field larger than its buffer"
        );
        // SAFETY: the field describes `count` elements inside `values`, which stays borrowed
        // (alive, and touched by no one else) as long as the session; both objects are freed
        // by `drop`, or here if the other could not be made.
        unsafe {
            let field = (api.zfp_field_1d)(
                values.as_mut_ptr().cast::<c_void>(),
                element.zfp_type(),
                count,
            );
            let zfp = (api.zfp_stream_open)(std::ptr::null_mut());
            let session = Self {
                api,
                field,
                zfp,
                _values: std::marker::PhantomData,
            };
            if field.is_null() || zfp.is_null() {
                return None;
            }
            (api.zfp_stream_set_accuracy)(zfp, tolerance);
            Some(session)
        }
    }

    /// Bytes of the largest stream for this field and accuracy.
    fn maximum_size(&self) -> usize {
        // SAFETY: both pointers are live objects owned by this session.
        unsafe { (self.api.zfp_stream_maximum_size)(self.zfp, self.field) }
    }

    /// Encodes the field into `output` (at least [`Session::maximum_size`] bytes); returns the
    /// bytes written, 0 on failure.
    fn compress_into(&mut self, output: &mut [u64]) -> usize {
        self.with_bit_stream(output, Direction::Encode)
    }

    /// Decodes `input` (at least [`Session::maximum_size`] bytes, the stream zero-padded) into
    /// the field; returns the bytes consumed, 0 on failure.
    fn decompress_from(&mut self, input: &mut [u64]) -> usize {
        self.with_bit_stream(input, Direction::Decode)
    }

    /// Attaches a bit stream over `buffer`, rewinds, runs the codec one way, and detaches.
    /// `buffer` must hold the maximum stream size, so that neither direction leaves it.
    fn with_bit_stream(&mut self, buffer: &mut [u64], direction: Direction) -> usize {
        assert!(
            buffer.len() * 8 >= self.maximum_size(),
            "bit-stream buffer below the maximum stream size"
        );
        let api = self.api;
        // SAFETY: the bit stream covers exactly `buffer`, borrowed for this call, and at least
        // the maximum stream ZFP writes or reads for this field (asserted above); it is
        // detached and closed before returning. The field and stream are live (see `open`).
        unsafe {
            let bits = (api.stream_open)(buffer.as_mut_ptr().cast::<c_void>(), buffer.len() * 8);
            if bits.is_null() {
                return 0;
            }
            (api.zfp_stream_set_bit_stream)(self.zfp, bits);
            (api.zfp_stream_rewind)(self.zfp);
            let n = match direction {
                Direction::Encode => (api.zfp_compress)(self.zfp, self.field),
                Direction::Decode => (api.zfp_decompress)(self.zfp, self.field),
            };
            (api.zfp_stream_set_bit_stream)(self.zfp, std::ptr::null_mut());
            (api.stream_close)(bits);
            n
        }
    }
}

/// Which way a [`Session`] runs the codec.
#[derive(Clone, Copy)]
enum Direction {
    Encode,
    Decode,
}

impl Drop for Session<'_> {
    fn drop(&mut self) {
        // SAFETY: each pointer is null or an object this session made and nothing else frees.
        unsafe {
            if !self.field.is_null() {
                (self.api.zfp_field_free)(self.field);
            }
            if !self.zfp.is_null() {
                (self.api.zfp_stream_close)(self.zfp);
            }
        }
    }
}

/// Why a ZFP stream did not decode.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ZfpDecodeError {
    /// The recorded error bound is not usable.
    #[error("ZFP tolerance {0:e} is not a positive finite number")]
    Tolerance(f64),
    /// Longer than any stream this page can have.
    #[error("ZFP stream of {length} bytes is longer than the {maximum} any such page needs")]
    TooLong {
        /// Stream length.
        length: usize,
        /// Largest possible stream.
        maximum: usize,
    },
    /// The decoder needed more bytes than the stream has (truncated) or fewer (padded).
    #[error("ZFP stream of {length} bytes decodes from {consumed} bytes (truncated or padded)")]
    Length {
        /// Stream length.
        length: usize,
        /// Bytes the decoder consumed.
        consumed: usize,
    },
    /// libzfp could not allocate its stream or field.
    #[error("libzfp could not allocate a stream")]
    OutOfMemory,
}

/// Opens the first of `names` that loads and resolves every symbol.
fn load_from(names: &[&str]) -> Result<ZfpApi, String> {
    let mut first = None;
    for name in names {
        // SAFETY: loading libzfp runs no code beyond its ELF constructors.
        match unsafe { libloading::Library::new(name) } {
            // SAFETY: libzfp 1.x exports these symbols with the declared C types.
            Ok(lib) => return unsafe { resolve(lib) },
            Err(e) => {
                first.get_or_insert_with(|| format!("{name}: {e}"));
            }
        }
    }
    Err(first.unwrap_or_else(|| "no library name to try".into()))
}

fn as_bytes_mut(words: &mut [u64]) -> &mut [u8] {
    let len = std::mem::size_of_val(words);
    // SAFETY: any u64 buffer is a valid byte buffer of 8x the length, same allocation.
    unsafe { std::slice::from_raw_parts_mut(words.as_mut_ptr().cast::<u8>(), len) }
}

/// # Safety
/// `library` must be libzfp 1.x.
unsafe fn resolve(library: libloading::Library) -> Result<ZfpApi, String> {
    macro_rules! symbol {
        ($name:ident) => {
            // SAFETY: the caller guarantees libzfp, whose symbol has the declared type; the
            // pointer stays valid because the library is stored in the same struct.
            *unsafe { library.get(concat!(stringify!($name), "\0").as_bytes()) }
                .map_err(|e: libloading::Error| e.to_string())?
        };
    }
    Ok(ZfpApi {
        stream_open: symbol!(stream_open),
        stream_close: symbol!(stream_close),
        zfp_stream_open: symbol!(zfp_stream_open),
        zfp_stream_close: symbol!(zfp_stream_close),
        zfp_stream_set_accuracy: symbol!(zfp_stream_set_accuracy),
        zfp_stream_maximum_size: symbol!(zfp_stream_maximum_size),
        zfp_stream_set_bit_stream: symbol!(zfp_stream_set_bit_stream),
        zfp_stream_rewind: symbol!(zfp_stream_rewind),
        zfp_field_1d: symbol!(zfp_field_1d),
        zfp_field_free: symbol!(zfp_field_free),
        zfp_compress: symbol!(zfp_compress),
        zfp_decompress: symbol!(zfp_decompress),
        _library: library,
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_missing_libzfp_is_a_clear_error() {
        let Err(e) = super::load_from(&["libzfp-strata-missing.so.1"]) else {
            panic!("a library that does not exist loaded");
        };
        assert!(e.contains("libzfp-strata-missing.so.1"), "{e}");
        let message = crate::CodecError::ZfpUnavailable(e).to_string();
        assert!(message.contains("apt-get install libzfp1"), "{message}");
    }
}
