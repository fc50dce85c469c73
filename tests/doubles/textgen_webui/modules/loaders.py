"""Test double of modules.loaders: the loader settings the host's Model tab offers."""


def list_model_elements():
    # The names of shared.args entries that the Model tab shows (a subset of the real list).
    return ["filter_by_loader", "loader", "cpu_memory", "gpu_layers", "threads", "threads_batch", "batch_size",
            "ctx_size", "cache_type", "tensor_split", "extra_flags", "gpu_split", "load_in_8bit", "load_in_4bit",
            "cpu", "no_mmap", "mlock", "numa"]
