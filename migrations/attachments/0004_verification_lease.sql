-- Verification of one pending file happens once at a time across the fleet: a verifier claims
-- the file by setting verifying_until (a lease), and every other verifier (another request, the
-- sweeper, another replica) waits for its outcome or leaves the file alone until the lease ends.
-- A crashed verifier's lease simply runs out. Expand only: earlier releases ignore the column.
ALTER TABLE files ADD COLUMN verifying_until timestamptz;
