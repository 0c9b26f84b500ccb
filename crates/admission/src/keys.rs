//! The hasher of the maps keyed by tenant or caller.

/// Tenant keys are already numbers (often hashes): a multiply spreads them well enough and costs
/// far less than SipHash on every admission and release. Keys come from the API, not from
/// attackers choosing collisions at this layer's scale (a few hundred slots).
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct KeyHasher;

impl std::hash::BuildHasher for KeyHasher {
    type Hasher = KeyHash;
    fn build_hasher(&self) -> KeyHash {
        KeyHash(0)
    }
}

pub(crate) struct KeyHash(u64);

impl std::hash::Hasher for KeyHash {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(u64::from(b));
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0.rotate_left(5) ^ n).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
    fn write_usize(&mut self, n: usize) {
        self.write_u64(n as u64);
    }
    fn write_isize(&mut self, n: isize) {
        self.write_u64(n.cast_unsigned() as u64);
    }
}
