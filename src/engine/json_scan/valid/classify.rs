//! A block of 64 bytes as bitmasks (bit i for byte i): SSE2 on x86_64 (its baseline: no
//! runtime detection), byte by byte elsewhere. The two are compared in the tests. The crate
//! denies `unsafe`; the two calls into the SSE2 functions below are its only exception (a
//! `target_feature` function is `unsafe` to call from one without the attribute, even where
//! the build enables the feature everywhere).

/// The classes every block needs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct Classes {
    /// `"`.
    pub(super) quote: u64,
    /// `{ } [ ] : ,`.
    pub(super) structural: u64,
    /// A quote, a structural or a space: not a byte of a scalar (nor are control bytes,
    /// counted apart).
    pub(super) not_scalar: u64,
    /// Whether there is a backslash or a control byte: then [`rare`] says where.
    pub(super) rare: bool,
}

/// The block's [`Classes`].
#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)]
#[inline(always)]
pub(super) fn block(block: &[u8; 64]) -> Classes {
    // SAFETY: the one requirement of a `target_feature` function is that the CPU has the
    // feature; SSE2 is part of the x86_64 baseline (every x86_64 CPU has it, and rustc's
    // x86_64 targets enable it: the assertion below fails the build otherwise).
    unsafe { sse2::block(block) }
}

/// The block's backslashes and control bytes (below 0x20).
#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)]
pub(super) fn rare(block: &[u8; 64]) -> (u64, u64) {
    // SAFETY: as in `block`: SSE2 is part of the x86_64 baseline.
    unsafe { sse2::rare(block) }
}

#[cfg(target_arch = "x86_64")]
const _: () = assert!(cfg!(target_feature = "sse2"), "x86_64 without SSE2");

#[cfg(not(target_arch = "x86_64"))]
pub(super) use portable::{block, rare};

#[cfg(target_arch = "x86_64")]
mod sse2 {
    use core::arch::x86_64::{
        __m128i, _mm_cmpeq_epi8, _mm_min_epu8, _mm_movemask_epi8, _mm_or_si128, _mm_set1_epi8,
        _mm_set_epi64x, _mm_setzero_si128,
    };

    use super::Classes;

    /// Bytes `at..at + 16` of `block` (two safe 8-byte reads; the compiler makes one load).
    #[target_feature(enable = "sse2")]
    fn lane(block: &[u8; 64], at: usize) -> __m128i {
        let word =
            |at: usize| i64::from_le_bytes(block[at..at + 8].try_into().expect("eight bytes"));
        _mm_set_epi64x(word(at + 8), word(at))
    }

    #[target_feature(enable = "sse2")]
    fn splat(byte: u8) -> __m128i {
        _mm_set1_epi8(byte as i8)
    }

    /// The 16 bits of a comparison's result, at lane `lane` of a 64-bit mask.
    #[target_feature(enable = "sse2")]
    fn bits(compared: __m128i, lane: usize) -> u64 {
        u64::from(_mm_movemask_epi8(compared) as u16) << (16 * lane)
    }

    #[target_feature(enable = "sse2")]
    pub(in super::super) fn block(block: &[u8; 64]) -> Classes {
        let mut classes = Classes::default();
        let mut rare = _mm_setzero_si128();
        for lane_index in 0..4 {
            let bytes = lane(block, lane_index * 16);
            let quote = _mm_cmpeq_epi8(bytes, splat(b'"'));
            // `[` and `]` are `{` and `}` but for bit 5.
            let folded = _mm_or_si128(bytes, splat(0x20));
            let brackets = _mm_or_si128(
                _mm_cmpeq_epi8(folded, splat(b'{')),
                _mm_cmpeq_epi8(folded, splat(b'}')),
            );
            let separators = _mm_or_si128(
                _mm_cmpeq_epi8(bytes, splat(b':')),
                _mm_cmpeq_epi8(bytes, splat(b',')),
            );
            let structural = _mm_or_si128(brackets, separators);
            let space = _mm_cmpeq_epi8(bytes, splat(b' '));
            let not_scalar = _mm_or_si128(_mm_or_si128(structural, quote), space);
            let backslash = _mm_cmpeq_epi8(bytes, splat(b'\\'));
            let control = _mm_cmpeq_epi8(_mm_min_epu8(bytes, splat(0x1f)), bytes);
            rare = _mm_or_si128(rare, _mm_or_si128(backslash, control));
            classes.quote |= bits(quote, lane_index);
            classes.structural |= bits(structural, lane_index);
            classes.not_scalar |= bits(not_scalar, lane_index);
        }
        classes.rare = _mm_movemask_epi8(rare) != 0;
        classes
    }

    /// The backslashes and the control bytes (below 0x20).
    #[target_feature(enable = "sse2")]
    pub(in super::super) fn rare(block: &[u8; 64]) -> (u64, u64) {
        let (mut backslash, mut control) = (0, 0);
        for lane_index in 0..4 {
            let bytes = lane(block, lane_index * 16);
            backslash |= bits(_mm_cmpeq_epi8(bytes, splat(b'\\')), lane_index);
            let low = _mm_cmpeq_epi8(_mm_min_epu8(bytes, splat(0x1f)), bytes);
            control |= bits(low, lane_index);
        }
        (backslash, control)
    }
}

/// Byte by byte: where there is no SSE2, and what the tests compare it with.
#[cfg_attr(target_arch = "x86_64", allow(dead_code))]
pub(super) mod portable {
    use super::Classes;

    pub(in super::super) fn block(block: &[u8; 64]) -> Classes {
        let mut classes = Classes::default();
        for (i, &byte) in block.iter().enumerate() {
            let bit = 1u64 << i;
            match byte {
                b'"' => classes.quote |= bit,
                b'{' | b'}' | b'[' | b']' | b':' | b',' => classes.structural |= bit,
                b'\\' | 0..=0x1f => classes.rare = true,
                _ => {}
            }
            if matches!(byte, b'"' | b'{' | b'}' | b'[' | b']' | b':' | b',' | b' ') {
                classes.not_scalar |= bit;
            }
        }
        classes
    }

    pub(in super::super) fn rare(block: &[u8; 64]) -> (u64, u64) {
        let (mut backslash, mut control) = (0, 0);
        for (i, &byte) in block.iter().enumerate() {
            match byte {
                b'\\' => backslash |= 1 << i,
                0..=0x1f => control |= 1 << i,
                _ => {}
            }
        }
        (backslash, control)
    }
}
