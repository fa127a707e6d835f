-- Dedup looks files up by the SHA-256 of their verified bytes; without this index that lookup
-- read every row of the owner (measured in BENCHMARKS.md, section 3).
CREATE INDEX files_owner_sha256_verified_idx ON files (owner, sha256) WHERE status = 'verified';
