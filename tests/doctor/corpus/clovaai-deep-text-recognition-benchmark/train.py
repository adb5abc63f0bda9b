# Public-code corpus case (trainwise doctor, issue 15): clovaai-deep-text-recognition-benchmark/train.py
# Source: https://github.com/clovaai/deep-text-recognition-benchmark/blob/e2117f2fb882b3c6085030500a260c113be27a63/train.py
# Repository: clovaai/deep-text-recognition-benchmark at commit e2117f2fb882b3c6085030500a260c113be27a63
# Path: train.py
# Licence: Apache-2.0 (copyright its authors); a verbatim excerpt for testing: only the lines named
# below are kept, unchanged but for IPython magics (replaced by `pass`) and the markers at line ends.
# Markers: `# expect: TWxxx` a real bug that must be reported; `# silent: TWxxx` a look-alike that
# must not be reported; `# latent: TWxxx` the pattern is there but has no effect in this program.

# --- lines 8-13 ---
import torch
import torch.backends.cudnn as cudnn
import torch.nn.init as init
import torch.optim as optim
import torch.utils.data
import numpy as np
# --- lines 22-22 ---
def train(opt):
# --- lines 78-87 ---
    # data parallel for multi-GPU
    model = torch.nn.DataParallel(model).to(device)
    model.train()
    if opt.saved_model != '':
        print(f'loading pretrained model from {opt.saved_model}')
        if opt.FT:
            model.load_state_dict(torch.load(opt.saved_model), strict=False)  # expect: TW302  # expect: TW301
        else:
            model.load_state_dict(torch.load(opt.saved_model))  # expect: TW301
    print("Model:")
# --- lines 229-229 ---
if __name__ == '__main__':
# --- lines 292-300 ---
    # print("Random Seed: ", opt.manualSeed)
    random.seed(opt.manualSeed)
    np.random.seed(opt.manualSeed)
    torch.manual_seed(opt.manualSeed)
    torch.cuda.manual_seed(opt.manualSeed)

    cudnn.benchmark = True
    cudnn.deterministic = True  # expect: TW202
    opt.num_gpu = torch.cuda.device_count()
