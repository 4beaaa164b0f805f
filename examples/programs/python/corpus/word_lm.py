"""
Word-level LSTM language model in the style of PyTorch's word_language_model
example.

Style imitated: a ``Dictionary`` / ``Corpus`` pair that tokenizes text into
word ids, ``batchify`` into columns, ``get_batch(source, i)`` slicing ``bptt``
steps, an ``RNNModel`` (embedding, LSTM, dropout, linear decoder, optional
tied weights), ``repackage_hidden`` between batches, a ``train()`` loop with
``model.zero_grad()``, gradient clipping and a hand-written SGD update on
``p.data`` (no torch.optim), ``evaluate()`` on validation data every epoch,
``torch.save(model, f)`` whenever the validation loss improves, and dividing
the learning rate by 4 when it does not.

The text is a small synthetic corpus produced by a toy grammar from a fixed
seed inside this script; nothing is downloaded.

Run by hand:

    python word_lm.py
    python word_lm.py --epochs 5 --tied --save /tmp/lm.pt
    python word_lm.py --device cuda

The model is saved to ``model.pt`` in the current directory by default
(``--save``). The script prints one final line with the last training loss and
the sum of all parameters at full precision.

Planted-bug flag:

    --unseeded   skip torch.manual_seed(args.seed): weights and dropout masks
                 change from run to run
"""

import argparse
import math
import random
import time

import torch
import torch.nn as nn

parser = argparse.ArgumentParser(description='PyTorch-style word-level LSTM language model')
parser.add_argument('--emsize', type=int, default=32, help='size of word embeddings')
parser.add_argument('--nhid', type=int, default=32, help='number of hidden units per layer')
parser.add_argument('--nlayers', type=int, default=2, help='number of layers')
parser.add_argument('--lr', type=float, default=20, help='initial learning rate')
parser.add_argument('--clip', type=float, default=0.25, help='gradient clipping')
parser.add_argument('--epochs', type=int, default=3, help='upper epoch limit')
parser.add_argument('--batch_size', type=int, default=8, metavar='N', help='batch size')
parser.add_argument('--bptt', type=int, default=16, help='sequence length')
parser.add_argument('--dropout', type=float, default=0.2, help='dropout applied to layers (0 = no dropout)')
parser.add_argument('--tied', action='store_true', help='tie the word embedding and softmax weights')
parser.add_argument('--seed', type=int, default=1111, help='random seed')
parser.add_argument('--device', default='cpu', help='cpu or cuda')
parser.add_argument('--log-interval', type=int, default=2, metavar='N', help='report interval')
parser.add_argument('--save', type=str, default='model.pt', help='path to save the final model')
parser.add_argument('--unseeded', action='store_true', help='planted bug: do not seed torch')
args = parser.parse_args()

# Set the random seed manually for reproducibility.
if not args.unseeded:
    torch.manual_seed(args.seed)

device = torch.device(args.device)

###############################################################################
# Load data
###############################################################################

SUBJECTS = ['the cat', 'a dog', 'the old man', 'my sister', 'the teacher', 'a bird', 'the river']
VERBS = ['sees', 'likes', 'follows', 'paints', 'finds', 'remembers', 'carries']
OBJECTS = ['the house', 'a red ball', 'the small boat', 'an apple', 'the garden', 'the letter']
ENDINGS = ['', 'in the morning', 'near the bridge', 'every day', 'with care', 'again']


def synthetic_text(n_lines, seed):
    rng = random.Random(seed)
    lines = []
    for _ in range(n_lines):
        words = [rng.choice(SUBJECTS), rng.choice(VERBS), rng.choice(OBJECTS), rng.choice(ENDINGS)]
        if rng.random() < 0.3:
            words += ['and', rng.choice(VERBS), rng.choice(OBJECTS)]
        lines.append(' '.join(w for w in words if w) + ' .')
    return lines


class Dictionary(object):
    def __init__(self):
        self.word2idx = {}
        self.idx2word = []

    def add_word(self, word):
        if word not in self.word2idx:
            self.idx2word.append(word)
            self.word2idx[word] = len(self.idx2word) - 1
        return self.word2idx[word]

    def __len__(self):
        return len(self.idx2word)


class Corpus(object):
    def __init__(self, seed=7):
        self.dictionary = Dictionary()
        self.train = self.tokenize(synthetic_text(110, seed))
        self.valid = self.tokenize(synthetic_text(30, seed + 1))
        self.test = self.tokenize(synthetic_text(30, seed + 2))

    def tokenize(self, lines):
        """Tokenizes a list of lines of text."""
        idss = []
        for line in lines:
            words = line.split() + ['<eos>']
            ids = [self.dictionary.add_word(word) for word in words]
            idss.append(torch.tensor(ids).type(torch.int64))
        return torch.cat(idss)


corpus = Corpus()

# Starting from sequential data, batchify arranges the dataset into columns.
# Each column is treated as independent by the model, so the dependence of
# e.g. 'g' on 'f' can not be learned, but allows more efficient batch processing.


def batchify(data, bsz):
    # Work out how cleanly we can divide the dataset into bsz parts.
    nbatch = data.size(0) // bsz
    # Trim off any extra elements that wouldn't cleanly fit (remainders).
    data = data.narrow(0, 0, nbatch * bsz)
    # Evenly divide the data across the bsz batches.
    data = data.view(bsz, -1).t().contiguous()
    return data.to(device)


eval_batch_size = 4
train_data = batchify(corpus.train, args.batch_size)
val_data = batchify(corpus.valid, eval_batch_size)
test_data = batchify(corpus.test, eval_batch_size)

###############################################################################
# Build the model
###############################################################################


class RNNModel(nn.Module):
    """Container module with an encoder, a recurrent module, and a decoder."""

    def __init__(self, ntoken, ninp, nhid, nlayers, dropout=0.5, tie_weights=False):
        super(RNNModel, self).__init__()
        self.ntoken = ntoken
        self.drop = nn.Dropout(dropout)
        self.encoder = nn.Embedding(ntoken, ninp)
        self.rnn = nn.LSTM(ninp, nhid, nlayers, dropout=dropout)
        self.decoder = nn.Linear(nhid, ntoken)
        if tie_weights:
            if nhid != ninp:
                raise ValueError('When using the tied flag, nhid must be equal to emsize')
            self.decoder.weight = self.encoder.weight
        self.init_weights()
        self.nhid = nhid
        self.nlayers = nlayers

    def init_weights(self):
        initrange = 0.1
        nn.init.uniform_(self.encoder.weight, -initrange, initrange)
        nn.init.zeros_(self.decoder.bias)
        nn.init.uniform_(self.decoder.weight, -initrange, initrange)

    def forward(self, input, hidden):
        emb = self.drop(self.encoder(input))
        output, hidden = self.rnn(emb, hidden)
        output = self.drop(output)
        decoded = self.decoder(output)
        decoded = decoded.view(-1, self.ntoken)
        return nn.functional.log_softmax(decoded, dim=1), hidden

    def init_hidden(self, bsz):
        weight = next(self.parameters())
        return (weight.new_zeros(self.nlayers, bsz, self.nhid),
                weight.new_zeros(self.nlayers, bsz, self.nhid))


ntokens = len(corpus.dictionary)
model = RNNModel(ntokens, args.emsize, args.nhid, args.nlayers, args.dropout, args.tied).to(device)
criterion = nn.NLLLoss()

###############################################################################
# Training code
###############################################################################


def repackage_hidden(h):
    """Wraps hidden states in new Tensors, to detach them from their history."""
    if isinstance(h, torch.Tensor):
        return h.detach()
    else:
        return tuple(repackage_hidden(v) for v in h)


# get_batch subdivides the source data into chunks of length args.bptt.
def get_batch(source, i):
    seq_len = min(args.bptt, len(source) - 1 - i)
    data = source[i:i + seq_len]
    target = source[i + 1:i + 1 + seq_len].view(-1)
    return data, target


def evaluate(data_source):
    # Turn on evaluation mode which disables dropout.
    model.eval()
    total_loss = 0.
    hidden = model.init_hidden(eval_batch_size)
    with torch.no_grad():
        for i in range(0, data_source.size(0) - 1, args.bptt):
            data, targets = get_batch(data_source, i)
            output, hidden = model(data, hidden)
            hidden = repackage_hidden(hidden)
            total_loss += len(data) * criterion(output, targets).item()
    return total_loss / (len(data_source) - 1)


last_loss = None


def train():
    global last_loss
    # Turn on training mode which enables dropout.
    model.train()
    total_loss = 0.
    start_time = time.time()
    hidden = model.init_hidden(args.batch_size)
    for batch, i in enumerate(range(0, train_data.size(0) - 1, args.bptt)):
        data, targets = get_batch(train_data, i)
        # Starting each batch, we detach the hidden state from how it was previously produced.
        # If we didn't, the model would try backpropagating all the way to start of the dataset.
        model.zero_grad()
        hidden = repackage_hidden(hidden)
        output, hidden = model(data, hidden)
        loss = criterion(output, targets)
        loss.backward()

        # `clip_grad_norm` helps prevent the exploding gradient problem in RNNs / LSTMs.
        torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
        for p in model.parameters():
            p.data.add_(p.grad, alpha=-lr)

        total_loss += loss.item()
        last_loss = loss

        if batch % args.log_interval == 0 and batch > 0:
            cur_loss = total_loss / args.log_interval
            elapsed = time.time() - start_time
            print('| epoch {:3d} | {:5d}/{:5d} batches | lr {:02.2f} | ms/batch {:5.2f} | '
                  'loss {:5.2f} | ppl {:8.2f}'.format(
                      epoch, batch, len(train_data) // args.bptt, lr,
                      elapsed * 1000 / args.log_interval, cur_loss, math.exp(cur_loss)))
            total_loss = 0
            start_time = time.time()


# Loop over epochs.
lr = args.lr
best_val_loss = None

for epoch in range(1, args.epochs + 1):
    epoch_start_time = time.time()
    train()
    val_loss = evaluate(val_data)
    print('-' * 89)
    print('| end of epoch {:3d} | time: {:5.2f}s | valid loss {:5.2f} | '
          'valid ppl {:8.2f}'.format(epoch, (time.time() - epoch_start_time),
                                     val_loss, math.exp(val_loss)))
    print('-' * 89)
    # Save the model if the validation loss is the best we've seen so far.
    if not best_val_loss or val_loss < best_val_loss:
        with open(args.save, 'wb') as f:
            torch.save(model, f)
        best_val_loss = val_loss
    else:
        # Anneal the learning rate if no improvement has been seen in the validation dataset.
        lr /= 4.0

param_sum = sum(p.detach().double().sum().item() for p in model.parameters())
print(f"final loss {last_loss.item()!r} param_sum {param_sum!r}")

# Load the best saved model and run it on test data.
with open(args.save, 'rb') as f:
    model = torch.load(f, weights_only=False)
    # after load the rnn params are not a continuous chunk of memory
    # this makes them a continuous chunk, and will speed up forward pass
    model.rnn.flatten_parameters()

test_loss = evaluate(test_data)
print('=' * 89)
print('| End of training | test loss {:5.2f} | test ppl {:8.2f}'.format(test_loss, math.exp(test_loss)))
print('=' * 89)
