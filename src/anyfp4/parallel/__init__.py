"""Tensor parallelism: each rank loads its own shard of every linear; one all-reduce after the row-parallel
projections (o_proj, down_proj). torch.distributed with NCCL on GPUs, gloo on CPUs.

- ``sharding``: the per-rank architecture and slices (column-parallel q/k/v and gate/up by rows, row-parallel
  o and down by columns), embeddings and norms replicated, the lm_head too or (``ANYFP4_TP_LM_HEAD=vocab``)
  split by vocabulary rows and all-gathered;
- ``allreduce``: the sums after the row-parallel linears (peer memory for decode rows, else NCCL);
- ``split_k``: each shard run with its full layer's split-K, so the ranks reproduce one GPU's bits;
- ``ranks``: the rank processes (process group, start, stop, rank 0's result);
- ``model``: a rank's shard of a model, and ``generate_tp``.
"""
