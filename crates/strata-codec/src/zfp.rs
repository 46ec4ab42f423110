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
        let api = &self.api;
        // SAFETY: the field describes `count` elements in `input`, alive for this call; the
        // streams are created, used and closed here; the output buffer holds the maximum
        // size ZFP reports for this field.
        unsafe {
            let field = (api.zfp_field_1d)(
                input.as_mut_ptr().cast::<c_void>(),
                element.zfp_type(),
                count,
            );
            let zfp = (api.zfp_stream_open)(std::ptr::null_mut());
            if field.is_null() || zfp.is_null() {
                return None;
            }
            (api.zfp_stream_set_accuracy)(zfp, tolerance);
            let capacity = (api.zfp_stream_maximum_size)(zfp, field);
            let mut output = vec![0u64; capacity.div_ceil(8)];
            let bits = (api.stream_open)(output.as_mut_ptr().cast::<c_void>(), output.len() * 8);
            (api.zfp_stream_set_bit_stream)(zfp, bits);
            (api.zfp_stream_rewind)(zfp);
            let written = (api.zfp_compress)(zfp, field);
            (api.zfp_field_free)(field);
            (api.zfp_stream_close)(zfp);
            (api.stream_close)(bits);
            if written == 0 {
                return None;
            }
            let mut bytes = as_bytes_mut(&mut output).to_vec();
            bytes.truncate(written);
            Some(bytes)
        }
    }

    /// Decompresses `compressed` into `page` (a whole page of `element`s). Returns false if
    /// ZFP consumed nothing.
    pub fn decompress(
        &self,
        element: ZfpElement,
        compressed: &[u8],
        tolerance: f64,
        page: &mut [u8],
    ) -> bool {
        let count = page.len() / element.bytes();
        let mut input = vec![0u64; compressed.len().div_ceil(8) + 1];
        as_bytes_mut(&mut input)[..compressed.len()].copy_from_slice(compressed);
        let mut output = vec![0u64; page.len().div_ceil(8)];
        let api = &self.api;
        // SAFETY: as in compress; the bit stream covers `input` (padded with a zero word so
        // ZFP's word-wise reads stay inside it) and the field covers `output`.
        let consumed = unsafe {
            let field = (api.zfp_field_1d)(
                output.as_mut_ptr().cast::<c_void>(),
                element.zfp_type(),
                count,
            );
            let zfp = (api.zfp_stream_open)(std::ptr::null_mut());
            if field.is_null() || zfp.is_null() {
                return false;
            }
            (api.zfp_stream_set_accuracy)(zfp, tolerance);
            let bits = (api.stream_open)(input.as_mut_ptr().cast::<c_void>(), input.len() * 8);
            (api.zfp_stream_set_bit_stream)(zfp, bits);
            (api.zfp_stream_rewind)(zfp);
            let consumed = (api.zfp_decompress)(zfp, field);
            (api.zfp_field_free)(field);
            (api.zfp_stream_close)(zfp);
            (api.stream_close)(bits);
            consumed
        };
        page.copy_from_slice(&as_bytes_mut(&mut output)[..page.len()]);
        consumed != 0
    }
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
