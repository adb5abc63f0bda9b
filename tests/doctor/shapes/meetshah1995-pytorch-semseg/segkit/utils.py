def drop_parallel_prefix(weights):
    first = next(iter(weights))
    if not first.startswith("module."):
        return weights
    return {key[len("module."):]: value for key, value in weights.items()}
