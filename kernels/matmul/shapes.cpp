// Matmul problem shapes, named after the real models they come from.
//
// mm/addmm problems are x[batch * rows_per_sample, K] . W[K, N] (+ bias[N]): the Linear layer of a
// model at a given batch. bmm problems are [batch * heads] independent [M, K] . [K, N] products.
// DeepBench lists its training GEMMs as M x N x K with N the minibatch; here the same product is run
// as x[batch = N, K] . W[K, M], so the batch axis keeps its name across the suite. The attention
// shapes run twice: on packed operands, and (arg view) on the heads of a transformer layer's fused
// QKV, probability and context buffers, as the encoder layer runs them (matmul.h, attention_gemm).
#include "kernels/matmul/matmul.h"

namespace hotops::matmul {

const std::vector<NamedShape>& named_shapes() {
  using V = std::vector<std::int64_t>;
  const std::vector<Op> linear{Op::mm, Op::addmm};
  const std::vector<Op> attention{Op::bmm};
  static const std::vector<NamedShape> shapes = {
      // The PyTorch tiny-MLP notebook: the 13-32-16-2 MLP, batch 10 in the notebook.
      {"mlp_tiny.fc1", linear, 1, 0, 0, 32, 13, V{1, 10, 4096}},
      // Max Woolf's Keras benchmarks: the MNIST MLP 784-512-512-10 (Keras batch 128).
      {"mlp_mnist.fc1", linear, 1, 0, 0, 512, 784, V{1, 128}},
      // The Spark NLP ClassifierDL study: 768-d sentence embeddings into a dense layer.
      {"classifierdl.fc1", linear, 1, 0, 0, 512, 768, V{32, 1024}},
      // BERT-base, sequence 128: tokens = batch x 128, hidden 768, FFN 3072, 12 heads of 64.
      {"bert.qkv", linear, 128, 0, 0, 2304, 768, V{32}},
      {"bert.ffn_up", linear, 128, 0, 0, 3072, 768, V{1, 8, 32}},
      {"bert.ffn_down", linear, 128, 0, 0, 768, 3072, V{32}},
      {"bert.attn_scores", attention, 0, 12, 128, 128, 64, V{1, 32}, false, "qkv.scores"},   // Q.K^T
      {"bert.attn_context", attention, 0, 12, 128, 64, 128, V{32}, false, "qkv.context"},   // softmax(QK^T).V
      // ViT-B/16 at 224x224: 197 tokens, same widths as BERT-base.
      {"vit.mlp_up", linear, 197, 0, 0, 3072, 768, V{32}},
      {"vit.attn_scores", attention, 0, 12, 197, 197, 64, V{32}, false, "qkv.scores"},
      {"vit.attn_context", attention, 0, 12, 197, 64, 197, V{32}, false, "qkv.context"},
      // DeepBench training GEMMs (M x N x K, N = batch).
      {"deepbench.1760", linear, 1, 0, 0, 1760, 1760, V{16, 128}},
      {"deepbench.2560", linear, 1, 0, 0, 2560, 2560, V{7000}},
      {"deepbench.5124x2560", linear, 1, 0, 0, 5124, 2560, V{9124}},
      // Max Woolf's Keras IMDb BiLSTM (model.bilstm_imdb): the dense head over both directions' final
      // hidden states, [2, batch, 128] read as [batch, 256], into 2 classes; its forward with the
      // bias (addmm) and both gradients (mm; the bias gradient comes with the loss).
      {"imdb_bilstm.dense", linear, 1, 0, 0, 2, 256, V{32, 64, 256}, false, "", 2},
      // Keras' lstm_text_generation.py (model.lstm_textgen): Dense(57) over the LSTM(128)'s last
      // hidden state, as the model step runs it (addmm fwd, mm's gradients; bias_grad's bias).
      {"lstm_textgen.dense", linear, 1, 0, 0, 57, 128, V{32, 128, 512}, false, "", 1, true},
      // The convnets' hidden dense layer (model_cnn: the flattened last pool to the hidden units), at
      // the batch of their one-thread entries; their f32 inference step runs addmm with the weights
      // prepacked (`w:packed`).
      {"keras_cnn.dense", linear, 1, 0, 0, 1024, 56448, V{16}, false, "", 1, false, true},
      {"vgg_cifar.dense", linear, 1, 0, 0, 512, 2304, V{32}, false, "", 1, false, true},
      // Square sizes, no batch axis: where the libraries reach their peak.
      {"square", linear, 0, 0, 2048, 2048, 2048, V{}},
      {"square", linear, 0, 0, 4096, 4096, 4096, V{}},
      // 8192^3 on CUDA only: one CPU execution takes over a second and shows what 4096^3 shows.
      {"square", linear, 0, 0, 8192, 8192, 8192, V{}, true},
  };
  return shapes;
}

}  // namespace hotops::matmul
