# Public-code corpus case (trainwise doctor, issue 30): labmlai-annotated-deep-learning-paper-implementations/labml_nn/scaling/zero3/finetune_neox.py
# Source: https://github.com/labmlai/annotated_deep_learning_paper_implementations/blob/e6b3c8a6a2cdae4071bcde1abeaaf9a2bc37bd53/labml_nn/scaling/zero3/finetune_neox.py
# Repository: labmlai/annotated_deep_learning_paper_implementations at commit e6b3c8a6a2cdae4071bcde1abeaaf9a2bc37bd53
# Path: labml_nn/scaling/zero3/finetune_neox.py
# Licence: MIT (copyright its authors); a verbatim excerpt for testing: only the lines named
# below are kept, unchanged but for the markers at line ends.
# Markers: `# expect: TWxxx` a real bug that must be reported; `# silent: TWxxx` a look-alike that
# must not be reported; `# latent: TWxxx` the pattern is there but has no effect in this program.

# --- lines 32-40 ---
@option(Configs.optimizer, 'Zero3Adam')
def _optimizer(c: Configs):
    """
    #### Set the optimizers for the model

    Note that we pass the sharded parameters from `get_trainable_chunk`.
    """
    from labml_nn.optimizers.adam_fp16 import AdamFP16
    return AdamFP16(c.model.get_trainable_chunk(), lr=c.learning_rate)
