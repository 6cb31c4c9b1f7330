"""Communication: the torch.distributed communicator, the in-process group, the spawn harness."""
