"""
Single-file GPT trainer in the style of nanoGPT's train.py.

Style imitated: module-level config variables overridden from the command
line with ``--key=value`` (a tiny configurator below), DDP detected from the
``RANK`` environment variable set by torchrun, uint16 token ids read through
``np.memmap`` from ``train.bin`` / ``val.bin``, gradient accumulation,
autocast context, GradScaler, cosine learning rate with warmup, AdamW with
weight-decay parameter groups, gradient clipping, periodic ``estimate_loss``.

The token files are tiny and synthetic: if ``train.bin`` / ``val.bin`` are
missing from ``data_dir`` (default: ``data/corpus_tokens/`` next to this
script) the script writes them itself from a fixed seed.

Run by hand:

    python nanogpt_train.py
    python nanogpt_train.py --max_iters=20 --batch_size=8
    torchrun --standalone --nproc-per-node=2 nanogpt_train.py
    torchrun --standalone --nproc-per-node=2 nanogpt_train.py --device=cuda --dtype=bfloat16

Every rank prints one final line with the last loss and the sum of all
parameters at full precision.

Planted-bug flags (each makes two runs with the same arguments differ):

    --seed_from_clock=True   seed torch from time.time_ns() instead of 1337
    --numpy_batches=True     get_batch draws its offsets with the unseeded
                             global numpy RNG instead of torch.randint
"""

import math
import os
import sys
import time
from ast import literal_eval
from contextlib import nullcontext

import numpy as np
import torch
import torch.nn as nn
from torch.nn import functional as F

# -----------------------------------------------------------------------------
# default config values
# I/O
data_dir = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'data', 'corpus_tokens')
eval_interval = 5
log_interval = 1
eval_iters = 2
eval_only = False
# data
gradient_accumulation_steps = 2  # total over all ranks, divided by world size below
batch_size = 4  # micro-batch size
block_size = 32
vocab_size = 96
# model
n_layer = 2
n_head = 4
n_embd = 48
dropout = 0.0
bias = False
# adamw optimizer
learning_rate = 3e-3
max_iters = 10
weight_decay = 1e-1
beta1 = 0.9
beta2 = 0.95
grad_clip = 1.0
# learning rate decay settings
decay_lr = True
warmup_iters = 3
lr_decay_iters = 10
min_lr = 3e-4
# system
backend = ''  # '' picks nccl on cuda and gloo on cpu
device = 'cpu'  # 'cpu', 'cuda', 'cuda:0', ...
dtype = 'float32'  # 'float32', 'bfloat16' or 'float16'
compile = False
seed = 1337
# planted bugs (negative controls)
seed_from_clock = False
numpy_batches = False
# -----------------------------------------------------------------------------
config_keys = [k for k, v in globals().items()
               if not k.startswith('_') and isinstance(v, (int, float, bool, str))]


def _configure(argv):
    """Override the globals above from --key=value (or --key value) arguments."""
    args = list(argv)
    while args:
        arg = args.pop(0)
        if not arg.startswith('--'):
            raise SystemExit(f"unexpected argument {arg!r}; use --key=value")
        if '=' in arg:
            key, val = arg[2:].split('=', 1)
        else:
            if not args:
                raise SystemExit(f"missing value for {arg!r}")
            key, val = arg[2:], args.pop(0)
        key = key.replace('-', '_')
        if key not in config_keys:
            raise SystemExit(f"Unknown config key: {key}")
        old = globals()[key]
        try:
            attempt = literal_eval(val)
        except (SyntaxError, ValueError):
            attempt = val  # a bare string
        if isinstance(old, bool) and isinstance(attempt, str):
            attempt = attempt.lower() in ('1', 'true', 'yes')
        if isinstance(old, float) and isinstance(attempt, int) and not isinstance(attempt, bool):
            attempt = float(attempt)
        if type(attempt) is not type(old):
            raise SystemExit(f"--{key}: expected {type(old).__name__}, got {val!r}")
        globals()[key] = attempt


_configure(sys.argv[1:])
config = {k: globals()[k] for k in config_keys}
# -----------------------------------------------------------------------------


# ----------------------------------------------------------------------------- model
class CausalSelfAttention(nn.Module):

    def __init__(self, cfg):
        super().__init__()
        assert cfg['n_embd'] % cfg['n_head'] == 0
        self.c_attn = nn.Linear(cfg['n_embd'], 3 * cfg['n_embd'], bias=cfg['bias'])
        self.c_proj = nn.Linear(cfg['n_embd'], cfg['n_embd'], bias=cfg['bias'])
        self.attn_dropout = nn.Dropout(cfg['dropout'])
        self.resid_dropout = nn.Dropout(cfg['dropout'])
        self.n_head = cfg['n_head']
        self.n_embd = cfg['n_embd']
        self.dropout = cfg['dropout']
        mask = torch.tril(torch.ones(cfg['block_size'], cfg['block_size']))
        self.register_buffer('mask', mask.view(1, 1, cfg['block_size'], cfg['block_size']),
                             persistent=False)

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        hs = C // self.n_head
        k = k.view(B, T, self.n_head, hs).transpose(1, 2)  # (B, nh, T, hs)
        q = q.view(B, T, self.n_head, hs).transpose(1, 2)
        v = v.view(B, T, self.n_head, hs).transpose(1, 2)
        # manual attention: (B, nh, T, hs) x (B, nh, hs, T) -> (B, nh, T, T)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))
        att = att.masked_fill(self.mask[:, :, :T, :T] == 0, float('-inf'))
        att = F.softmax(att, dim=-1)
        att = self.attn_dropout(att)
        y = att @ v
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.resid_dropout(self.c_proj(y))


class MLP(nn.Module):

    def __init__(self, cfg):
        super().__init__()
        self.c_fc = nn.Linear(cfg['n_embd'], 4 * cfg['n_embd'], bias=cfg['bias'])
        self.gelu = nn.GELU()
        self.c_proj = nn.Linear(4 * cfg['n_embd'], cfg['n_embd'], bias=cfg['bias'])
        self.dropout = nn.Dropout(cfg['dropout'])

    def forward(self, x):
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))


class Block(nn.Module):

    def __init__(self, cfg):
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg['n_embd'], bias=cfg['bias'])
        self.attn = CausalSelfAttention(cfg)
        self.ln_2 = nn.LayerNorm(cfg['n_embd'], bias=cfg['bias'])
        self.mlp = MLP(cfg)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        x = x + self.mlp(self.ln_2(x))
        return x


class GPT(nn.Module):

    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(cfg['vocab_size'], cfg['n_embd']),
            wpe=nn.Embedding(cfg['block_size'], cfg['n_embd']),
            drop=nn.Dropout(cfg['dropout']),
            h=nn.ModuleList([Block(cfg) for _ in range(cfg['n_layer'])]),
            ln_f=nn.LayerNorm(cfg['n_embd'], bias=cfg['bias']),
        ))
        self.lm_head = nn.Linear(cfg['n_embd'], cfg['vocab_size'], bias=False)
        # weight tying
        self.transformer.wte.weight = self.lm_head.weight
        self.apply(self._init_weights)
        # scaled init of the residual projections
        for pn, p in self.named_parameters():
            if pn.endswith('c_proj.weight'):
                torch.nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * cfg['n_layer']))

    def _init_weights(self, module):
        if isinstance(module, nn.Linear):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                torch.nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def forward(self, idx, targets=None):
        b, t = idx.size()
        assert t <= self.cfg['block_size']
        pos = torch.arange(0, t, dtype=torch.long, device=idx.device)
        x = self.transformer.drop(self.transformer.wte(idx) + self.transformer.wpe(pos))
        for block in self.transformer.h:
            x = block(x)
        x = self.transformer.ln_f(x)
        logits = self.lm_head(x)
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))
        return logits, loss

    def configure_optimizers(self, weight_decay, learning_rate, betas, device_type):
        param_dict = {pn: p for pn, p in self.named_parameters() if p.requires_grad}
        # every 2D tensor (matmul weights, embeddings) decays; biases and norms don't
        decay_params = [p for n, p in param_dict.items() if p.dim() >= 2]
        nodecay_params = [p for n, p in param_dict.items() if p.dim() < 2]
        optim_groups = [
            {'params': decay_params, 'weight_decay': weight_decay},
            {'params': nodecay_params, 'weight_decay': 0.0},
        ]
        extra_args = dict(fused=True) if device_type == 'cuda' else dict()
        return torch.optim.AdamW(optim_groups, lr=learning_rate, betas=betas, **extra_args)


# ----------------------------------------------------------------------------- data
def _write_tokens(path, n_tokens, rng_seed):
    """A small synthetic token stream with some structure (repeating 'words')."""
    rng = np.random.default_rng(rng_seed)
    words = [rng.integers(1, vocab_size, size=rng.integers(2, 7)) for _ in range(40)]
    out = []
    while len(out) < n_tokens:
        out.extend(words[rng.integers(0, len(words))].tolist())
        out.append(0)  # separator
    arr = np.array(out[:n_tokens], dtype=np.uint16)
    tmp = f"{path}.tmp.{os.getpid()}"
    arr.tofile(tmp)
    os.replace(tmp, path)  # atomic: several ranks may race to write the same bytes


def prepare_data():
    os.makedirs(data_dir, exist_ok=True)
    for split, n, s in (('train', 20000, 0), ('val', 4000, 1)):
        path = os.path.join(data_dir, f'{split}.bin')
        if not os.path.exists(path):
            _write_tokens(path, n, s)


# ----------------------------------------------------------------------------- setup
ddp = int(os.environ.get('RANK', -1)) != -1  # is this a ddp run?
if not backend:
    backend = 'nccl' if device.startswith('cuda') else 'gloo'
if ddp:
    from torch.distributed import init_process_group, destroy_process_group
    from torch.nn.parallel import DistributedDataParallel as DDP
    init_process_group(backend=backend)
    ddp_rank = int(os.environ['RANK'])
    ddp_local_rank = int(os.environ['LOCAL_RANK'])
    ddp_world_size = int(os.environ['WORLD_SIZE'])
    if device.startswith('cuda'):
        device = f'cuda:{ddp_local_rank}'
        torch.cuda.set_device(device)
    master_process = ddp_rank == 0  # this process will do logging
    seed_offset = ddp_rank  # each process gets a different seed
    assert gradient_accumulation_steps % ddp_world_size == 0
    gradient_accumulation_steps //= ddp_world_size
else:
    ddp_rank = 0
    master_process = True
    seed_offset = 0
    ddp_world_size = 1
tokens_per_iter = gradient_accumulation_steps * ddp_world_size * batch_size * block_size
if master_process:
    print(f"tokens per iteration will be: {tokens_per_iter:,}")

if seed_from_clock:
    torch.manual_seed(time.time_ns() % 2**63)  # PLANTED BUG: a new seed every run
else:
    torch.manual_seed(seed + seed_offset)
device_type = 'cuda' if 'cuda' in device else 'cpu'
ptdtype = {'float32': torch.float32, 'bfloat16': torch.bfloat16, 'float16': torch.float16}[dtype]
ctx = nullcontext() if device_type == 'cpu' else torch.amp.autocast(device_type=device_type, dtype=ptdtype)

prepare_data()


def get_batch(split):
    # recreate the memmap every batch to avoid a memory leak, as nanoGPT does
    name = 'train.bin' if split == 'train' else 'val.bin'
    data = np.memmap(os.path.join(data_dir, name), dtype=np.uint16, mode='r')
    if numpy_batches:
        ix = torch.from_numpy(np.random.randint(len(data) - block_size, size=(batch_size,)))  # PLANTED BUG
    else:
        ix = torch.randint(len(data) - block_size, (batch_size,))
    x = torch.stack([torch.from_numpy((data[i:i + block_size]).astype(np.int64)) for i in ix])
    y = torch.stack([torch.from_numpy((data[i + 1:i + 1 + block_size]).astype(np.int64)) for i in ix])
    if device_type == 'cuda':
        x, y = x.pin_memory().to(device, non_blocking=True), y.pin_memory().to(device, non_blocking=True)
    else:
        x, y = x.to(device), y.to(device)
    return x, y


iter_num = 0
best_val_loss = 1e9

model_args = dict(n_layer=n_layer, n_head=n_head, n_embd=n_embd, block_size=block_size,
                  bias=bias, vocab_size=vocab_size, dropout=dropout)
model = GPT(model_args)
model.to(device)

scaler = torch.amp.GradScaler(device_type, enabled=(dtype == 'float16'))
optimizer = model.configure_optimizers(weight_decay, learning_rate, (beta1, beta2), device_type)

if compile:
    if master_process:
        print("compiling the model...")
    unoptimized_model = model
    model = torch.compile(model)

if ddp:
    model = DDP(model, device_ids=[ddp_local_rank] if device_type == 'cuda' else None)


@torch.no_grad()
def estimate_loss():
    out = {}
    model.eval()
    for split in ['train', 'val']:
        losses = torch.zeros(eval_iters)
        for k in range(eval_iters):
            X, Y = get_batch(split)
            with ctx:
                logits, loss = model(X, Y)
            losses[k] = loss.item()
        out[split] = losses.mean()
    model.train()
    return out


def get_lr(it):
    # 1) linear warmup for warmup_iters steps
    if it < warmup_iters:
        return learning_rate * (it + 1) / (warmup_iters + 1)
    # 2) if it > lr_decay_iters, return min learning rate
    if it > lr_decay_iters:
        return min_lr
    # 3) in between, cosine decay down to min learning rate
    decay_ratio = (it - warmup_iters) / (lr_decay_iters - warmup_iters)
    assert 0 <= decay_ratio <= 1
    coeff = 0.5 * (1.0 + math.cos(math.pi * decay_ratio))
    return min_lr + coeff * (learning_rate - min_lr)


# ----------------------------------------------------------------------------- training loop
X, Y = get_batch('train')  # fetch the very first batch
t0 = time.time()
raw_model = model.module if ddp else model
while True:
    lr = get_lr(iter_num) if decay_lr else learning_rate
    for param_group in optimizer.param_groups:
        param_group['lr'] = lr

    if iter_num % eval_interval == 0 and iter_num > 0:
        losses = estimate_loss()
        if master_process:
            print(f"step {iter_num}: train loss {losses['train']:.4f}, val loss {losses['val']:.4f}")
        best_val_loss = min(best_val_loss, float(losses['val']))
    if iter_num == 0 and eval_only:
        break

    for micro_step in range(gradient_accumulation_steps):
        if ddp:
            # only sync gradients at the last micro step
            model.require_backward_grad_sync = (micro_step == gradient_accumulation_steps - 1)
        with ctx:
            logits, loss = model(X, Y)
            loss = loss / gradient_accumulation_steps
        # prefetch the next batch while the model is busy
        X, Y = get_batch('train')
        scaler.scale(loss).backward()
    if grad_clip != 0.0:
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad(set_to_none=True)

    t1 = time.time()
    dt = t1 - t0
    t0 = t1
    if iter_num % log_interval == 0 and master_process:
        lossf = loss.item() * gradient_accumulation_steps
        print(f"iter {iter_num}: loss {lossf:.4f}, lr {lr:.2e}, time {dt * 1000:.2f}ms")
    iter_num += 1

    if iter_num >= max_iters:
        break

param_sum = sum(p.detach().double().sum().item() for p in raw_model.parameters())
print(f"rank {ddp_rank} final loss {(loss.item() * gradient_accumulation_steps)!r} "
      f"param_sum {param_sum!r}")

if ddp:
    destroy_process_group()
