"""KV memory of one worker group: the block allocator, the ledger of where each job's KV
lives, the four KV policies, and displacement of paused jobs for one that does not fit."""
