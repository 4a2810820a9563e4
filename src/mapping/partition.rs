//! Partition choice compatible with the Java Kafka client. Pure: no I/O.
//!
//! Java's `DefaultPartitioner` (and `BuiltInPartitioner.partitionForKey`) places a keyed record
//! in `toPositive(murmur2(keyBytes)) % numPartitions`; librdkafka's `murmur2_random`
//! partitioner does the same. The relay keys records by event id but partitions them by
//! aggregate id (`outbox.partition_by`), so it computes the partition itself with exactly that
//! function: a Java producer keyed by the aggregate id would pick the same partition.

/// Kafka's `Utils.murmur2`: MurmurHash2, 32 bit, seed `0x9747b28c`, little-endian blocks.
pub fn murmur2(data: &[u8]) -> i32 {
    const SEED: u32 = 0x9747_b28c;
    const M: u32 = 0x5bd1_e995;
    const R: u32 = 24;

    // Java does this arithmetic on `int`: wrapping multiplication, logical shifts (`>>>`).
    let mut h: u32 = SEED ^ data.len() as u32;
    let mut blocks = data.chunks_exact(4);
    for block in &mut blocks {
        let mut k = u32::from_le_bytes([block[0], block[1], block[2], block[3]]);
        k = k.wrapping_mul(M);
        k ^= k >> R;
        k = k.wrapping_mul(M);
        h = h.wrapping_mul(M);
        h ^= k;
    }
    let tail = blocks.remainder();
    // Java's switch falls through from case 3 to case 1.
    if tail.len() >= 3 {
        h ^= u32::from(tail[2]) << 16;
    }
    if tail.len() >= 2 {
        h ^= u32::from(tail[1]) << 8;
    }
    if !tail.is_empty() {
        h ^= u32::from(tail[0]);
        h = h.wrapping_mul(M);
    }
    h ^= h >> 13;
    h = h.wrapping_mul(M);
    h ^= h >> 15;
    h as i32
}

/// Kafka's `Utils.toPositive`: clears the sign bit (not `abs`, which overflows on `MIN`).
pub fn to_positive(n: i32) -> i32 {
    n & 0x7fff_ffff
}

/// The partition the Java client's default partitioner gives a record keyed by `key`.
/// `partition_count` must be positive.
pub fn partition_for_key(key: &[u8], partition_count: i32) -> i32 {
    debug_assert!(partition_count > 0);
    to_positive(murmur2(key)) % partition_count.max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Kafka's own vectors: `clients/src/test/java/org/apache/kafka/common/utils/UtilsTest.java`,
    /// `testMurmur2`.
    #[test]
    fn murmur2_matches_the_java_client() {
        let cases: [(&[u8], i32); 6] = [
            (b"21", -973_932_308),
            (b"foobar", -790_332_482),
            (b"a-little-bit-long-string", -985_981_536),
            (b"a-little-bit-longer-string", -1_486_304_829),
            (
                b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8",
                -58_897_971,
            ),
            (b"abc", 479_470_107),
        ];
        for (input, expected) in cases {
            assert_eq!(
                murmur2(input),
                expected,
                "murmur2({:?})",
                String::from_utf8_lossy(input)
            );
        }
    }

    #[test]
    fn every_tail_length_is_hashed() {
        // Lengths 0..8 cover every remainder of the 4-byte blocks; the values differ.
        let hashes: Vec<i32> = (0..8).map(|n| murmur2(&b"abcdefgh"[..n])).collect();
        let mut unique = hashes.clone();
        unique.sort_unstable();
        unique.dedup();
        assert_eq!(unique.len(), hashes.len(), "{hashes:?}");
        // Seed ^ 0, then the final mix: a fixed value for the empty input.
        assert_eq!(murmur2(b""), murmur2(&[]));
    }

    #[test]
    fn to_positive_clears_only_the_sign_bit() {
        assert_eq!(to_positive(-973_932_308), -973_932_308 & 0x7fff_ffff);
        assert_eq!(to_positive(i32::MIN), 0);
        assert_eq!(to_positive(-1), i32::MAX);
        assert_eq!(to_positive(42), 42);
    }

    #[test]
    fn partition_is_positive_murmur2_modulo_count() {
        // toPositive(-973932308) = 1173551340; 1173551340 % 6 = 0, % 4 = 0, % 7 = 2.
        assert_eq!(to_positive(-973_932_308), 1_173_551_340);
        assert_eq!(partition_for_key(b"21", 6), 1_173_551_340 % 6);
        assert_eq!(partition_for_key(b"21", 7), 1_173_551_340 % 7);
        // toPositive(479470107) = 479470107.
        assert_eq!(partition_for_key(b"abc", 6), 479_470_107 % 6);
        for count in 1..=64 {
            for key in [&b"21"[..], b"foobar", b"order-17", b""] {
                let p = partition_for_key(key, count);
                assert!((0..count).contains(&p));
            }
        }
        assert_eq!(partition_for_key(b"anything", 1), 0);
    }
}
