import torch

if __name__ == "__main__":
    waves = torch.load("waves.pt")  # expect: TW301
    train_x = torch.from_numpy(waves[4:, :-1])  # silent: TW116
    train_y = torch.from_numpy(waves[4:, 1:])
    held_x = torch.from_numpy(waves[:4, :-1])
    held_y = torch.from_numpy(waves[:4, 1:])
    print(train_x.shape, train_y.shape, held_x.shape, held_y.shape)
