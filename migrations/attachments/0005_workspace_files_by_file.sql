-- Workspace entries looked up by file: erasure asks whether any session still links a file
-- (services/attachments/src/erase.rs), and deleting a file cascades to its entries
-- (workspace_files_file_fkey). Without this index each of those read the whole table, once per
-- file. Expand only: earlier releases merely keep it up to date.
CREATE INDEX workspace_files_file_idx ON workspace_files (file_id);
