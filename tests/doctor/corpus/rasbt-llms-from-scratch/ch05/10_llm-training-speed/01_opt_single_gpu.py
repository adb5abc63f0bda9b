# Public-code corpus case (trainwise doctor, issue 30): rasbt-llms-from-scratch/ch05/10_llm-training-speed/01_opt_single_gpu.py
# Source: https://github.com/rasbt/LLMs-from-scratch/blob/28c65cdfbc3338e2e040016eea4b7fdf556e4d57/ch05/10_llm-training-speed/01_opt_single_gpu.py
# Repository: rasbt/LLMs-from-scratch at commit 28c65cdfbc3338e2e040016eea4b7fdf556e4d57
# Path: ch05/10_llm-training-speed/01_opt_single_gpu.py
# Licence: Apache-2.0 (copyright its authors); a verbatim excerpt for testing: only the lines named
# below are kept, unchanged but for the markers at line ends.
# Markers: `# expect: TWxxx` a real bug that must be reported; `# silent: TWxxx` a look-alike that
# must not be reported; `# latent: TWxxx` the pattern is there but has no effect in this program.

# --- lines 12-13 ---
import torch
import torch.nn as nn
# --- lines 374-375 ---
def main(gpt_config, settings):

# --- lines 413-415 ---
    model = GPTModel(gpt_config)
    model = torch.compile(model)  # silent: TW115
    model.to(device).to(torch.bfloat16)
# --- lines 455-466 ---
    train_losses, val_losses, tokens_seen = train_model_simple_with_timing(
        model=model,
        train_loader=train_loader,
        val_loader=val_loader,
        optimizer=optimizer,
        device=device,
        num_epochs=settings["num_epochs"],
        eval_freq=10,
        eval_iter=1,
        start_context="Every effort moves you",
        tokenizer=tokenizer
    )
