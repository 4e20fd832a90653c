//! Random secrets from the operating system, and bytes as hex: API tokens, CSRF tokens, engine keys. Below
//! the accounts and the runtime, which both make secrets.

use argon2::password_hash::rand_core::{OsRng, RngCore};

/// Bytes as lower-case hex. (Every API request digests its token: no allocation per byte.)
pub(crate) fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        out.push(DIGITS[usize::from(b >> 4)] as char);
        out.push(DIGITS[usize::from(b & 0xf)] as char);
    }
    out
}

/// `count` random bytes from the operating system, as hex.
pub(crate) fn random_hex(count: usize) -> String {
    let mut bytes = vec![0u8; count];
    OsRng.fill_bytes(&mut bytes);
    hex(&bytes)
}
