//! Sealed cursors: a page's `next_cursor` is the domain's keyset cursor encrypted and
//! authenticated (ChaCha20-Poly1305) under a key derived from the JWT secret.
//!
//! The domain's cursor is the sort key of the last row: for contacts, the contact's id and
//! lower-cased name or email. Plain, that is personal data in URLs, logs and browser histories;
//! sealed, a cursor reads as noise and cannot be forged or edited (a changed byte fails the tag,
//! a 400 like any bad cursor). Every task of a deployment shares the secret, so a cursor works on
//! any of them; rotating the secret ends the cursors in flight (their clients start the list
//! again), as it ends the tokens.

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use chacha20poly1305::aead::{Aead, KeyInit};
use chacha20poly1305::{ChaCha20Poly1305, Key, Nonce};
use hmac::{Hmac, Mac};
use secrecy::{ExposeSecret as _, SecretString};
use sha2::Sha256;

/// The label the cursor key is derived under, so it is never the token key itself.
const KEY_LABEL: &[u8] = b"breakwater cursor seal v1";
const NONCE_LEN: usize = 12;
/// Longest sealed cursor accepted: the domain's own bound on a plain cursor, sealed.
const MAX_SEALED_LEN: usize = 1536;

/// Seals and opens cursors.
#[derive(Clone)]
pub struct CursorSeal {
    cipher: ChaCha20Poly1305,
}

impl std::fmt::Debug for CursorSeal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CursorSeal(..)")
    }
}

/// A sealed cursor that did not open.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("cursor is not valid")]
pub struct BadSeal;

impl CursorSeal {
    /// The seal for a deployment's secret (HMAC-SHA256 of a fixed label, keyed with the secret).
    #[must_use]
    pub fn from_secret(secret: &SecretString) -> Self {
        #[allow(clippy::expect_used)] // HMAC takes a key of any length
        let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(secret.expose_secret().as_bytes()).expect("any key length");
        mac.update(KEY_LABEL);
        let key = mac.finalize().into_bytes();
        Self { cipher: ChaCha20Poly1305::new(Key::from_slice(&key)) }
    }

    /// Seals a plain cursor: base64url of a random nonce and the ciphertext with its tag.
    #[must_use]
    pub fn seal(&self, plain: &str) -> String {
        let mut nonce = [0u8; NONCE_LEN];
        #[allow(clippy::expect_used)] // getrandom fails only on platforms without an entropy source
        getrandom::fill(&mut nonce).expect("the OS random number generator failed");
        #[allow(clippy::expect_used)] // encryption fails only past 256 GiB per message
        let sealed = self.cipher.encrypt(Nonce::from_slice(&nonce), plain.as_bytes()).expect("a cursor is small");
        let mut out = nonce.to_vec();
        out.extend_from_slice(&sealed);
        URL_SAFE_NO_PAD.encode(out)
    }

    /// Opens a cursor made by [`CursorSeal::seal`] with the same secret.
    ///
    /// # Errors
    /// [`BadSeal`] for anything else: garbage, an edited cursor, another secret's.
    pub fn open(&self, sealed: &str) -> Result<String, BadSeal> {
        if sealed.len() > MAX_SEALED_LEN {
            return Err(BadSeal);
        }
        let bytes = URL_SAFE_NO_PAD.decode(sealed).map_err(|_| BadSeal)?;
        let (nonce, body) = bytes.split_at_checked(NONCE_LEN).ok_or(BadSeal)?;
        let plain = self.cipher.decrypt(Nonce::from_slice(nonce), body).map_err(|_| BadSeal)?;
        String::from_utf8(plain).map_err(|_| BadSeal)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seal() -> CursorSeal {
        CursorSeal::from_secret(&SecretString::from("test-secret-test-secret-test-secret"))
    }

    #[test]
    fn a_sealed_cursor_opens_and_reads_as_noise() {
        let plain = "s:0190e1c2-7a51-7c3e-9f00-0123456789ab:ann.lovelace@example.com";
        let sealed = seal().seal(plain);
        assert_eq!(seal().open(&sealed).as_deref(), Ok(plain));
        let decoded = URL_SAFE_NO_PAD.decode(&sealed).expect("base64url");
        let text = String::from_utf8_lossy(&decoded);
        assert!(!text.contains("ann") && !text.contains("0190e1c2"), "readable: {text}");
        assert_ne!(seal().seal(plain), sealed, "a fresh nonce each time");
    }

    #[test]
    fn an_edited_forged_or_foreign_cursor_does_not_open() {
        let sealed = seal().seal("t:1700000000000000:0190e1c2-7a51-7c3e-9f00-0123456789ab");
        let mut bytes = URL_SAFE_NO_PAD.decode(&sealed).expect("base64url");
        let last = bytes.len() - 1;
        bytes[last] ^= 1;
        let other = CursorSeal::from_secret(&SecretString::from("another-secret-another-secret-xx"));
        let plain_cursor = URL_SAFE_NO_PAD.encode("t:1700000000000000:0190e1c2-7a51-7c3e-9f00-0123456789ab");
        for bad in [URL_SAFE_NO_PAD.encode(&bytes), other.seal("t:1:x"), plain_cursor, String::new(), "!!".into()] {
            assert_eq!(seal().open(&bad), Err(BadSeal), "{bad}");
        }
        assert_eq!(seal().open(&"A".repeat(MAX_SEALED_LEN + 1)), Err(BadSeal));
    }
}
