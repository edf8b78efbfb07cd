// conv2d problem shapes, named after the layers of the real models they come from.
//
// ResNet-50 is torchvision's (v1.5: the stride-2 of a stage is on its 3x3 conv); its convs have no
// bias (a BatchNorm follows). The CIFAR-10 VGG-like net (Keras' cifar10_cnn) and the 256x256
// Keras CNN of the TensorFlow 2 comparison use Conv2D with a bias. DeepBench's rows are from its
// training set (code/kernels/conv_problems.h: w, h, c, n, k, s, r, pad, stride), at DeepBench's own
// batch sizes. ConvNeXt-T's blocks open with a depthwise 7x7 convolution (padding 3, groups =
// channels, with a bias), named here at its stage 1 (96 channels at 56x56 for a 224x224 image) and
// stage 3 (384 channels at 14x14).
#include "kernels/conv2d/conv2d.h"

namespace hotops::conv2d {

const std::vector<NamedShape>& named_shapes() {
  using V = std::vector<std::int64_t>;
  static const std::vector<NamedShape> shapes = {
      //  name                          C    H    W    K    R   S  stride pad bias  batches
      // ResNet-50 at 224x224.
      {"resnet50.conv1",                3, 224, 224,  64,  7,  7,  2,  3, false, V{32}},
      {"resnet50.res2_1x1_expand",     64,  56,  56, 256,  1,  1,  1,  0, false, V{32}},
      {"resnet50.res2_3x3",            64,  56,  56,  64,  3,  3,  1,  1, false, V{32, 1}},
      {"resnet50.res3_3x3_stride2",   128,  56,  56, 128,  3,  3,  2,  1, false, V{32}},
      {"resnet50.res3_3x3",           128,  28,  28, 128,  3,  3,  1,  1, false, V{32}},
      {"resnet50.res4_3x3",           256,  14,  14, 256,  3,  3,  1,  1, false, V{32}},
      {"resnet50.res5_3x3",           512,   7,   7, 512,  3,  3,  1,  1, false, V{32, 1}},
      // Max Woolf's Keras benchmarks: the CIFAR-10 VGG-like CNN on 32x32 images (second and third
      // conv layers).
      {"cifar10_vgg.conv2",            32,  32,  32,  32,  3,  3,  1,  0, true,  V{32}, true},
      {"cifar10_vgg.conv3",            32,  15,  15,  64,  3,  3,  1,  1, true,  V{32}, true},
      // The TensorFlow 2 comparison: the Keras CNN on 256x256x3 images (first and second conv
      // layers; batch 64 there).
      {"keras_cnn.conv1",               3, 256, 256,  32,  3,  3,  1,  1, true,  V{32}},
      {"keras_cnn.conv2",              32,  85,  85,  64,  3,  3,  1,  1, true,  V{32}, true},
      // DeepBench training rows: DeepSpeech's first conv (spectrogram 161 x 700, a 5x20 filter) and
      // a GoogLeNet inception 5x5 branch.
      {"deepbench.deepspeech_conv1",    1, 161, 700,  32,  5, 20,  2,  0, false, V{16}},
      {"deepbench.inception_5x5",     192,  28,  28,  32,  5,  5,  1,  2, false, V{16}},
      //  name                          C    H    W    K    R   S  stride pad bias  batches   relu  groups
      {"convnext.s1_dwconv",           96,  56,  56,  96,  7,  7,  1,  3, true,  V{8, 32}, false,  96},
      {"convnext.s3_dwconv",          384,  14,  14, 384,  7,  7,  1,  3, true,  V{8, 32}, false, 384},
  };
  return shapes;
}

}  // namespace hotops::conv2d
