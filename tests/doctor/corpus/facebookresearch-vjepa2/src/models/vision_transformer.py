# Public-code corpus case (trainwise doctor, issue 30): facebookresearch-vjepa2/src/models/vision_transformer.py
# Source: https://github.com/facebookresearch/vjepa2/blob/c2963a47433ecca0ad4f06ec28bcfa8cb5b5cefb/src/models/vision_transformer.py
# Repository: facebookresearch/vjepa2 at commit c2963a47433ecca0ad4f06ec28bcfa8cb5b5cefb
# Path: src/models/vision_transformer.py
# Licence: MIT (copyright its authors); a verbatim excerpt for testing: only the lines named
# below are kept, unchanged but for the markers at line ends.
# Markers: `# expect: TWxxx` a real bug that must be reported; `# silent: TWxxx` a look-alike that
# must not be reported; `# latent: TWxxx` the pattern is there but has no effect in this program.

# --- lines 9-10 ---
import torch
import torch.nn as nn
# --- lines 19-19 ---
class VisionTransformer(nn.Module):
# --- lines 118-128 ---
    def _init_pos_embed(self, pos_embed):
        embed_dim = pos_embed.size(-1)
        grid_size = self.img_height // self.patch_size  # TODO: update; currently assumes square input
        if self.is_video:
            grid_depth = self.num_frames // self.tubelet_size
            sincos = get_3d_sincos_pos_embed(
                embed_dim, grid_size, grid_depth, cls_token=False, uniform_power=self.uniform_power
            )
        else:
            sincos = get_2d_sincos_pos_embed(embed_dim, grid_size, cls_token=False)
        pos_embed.copy_(torch.from_numpy(sincos).float().unsqueeze(0))  # silent: TW116
