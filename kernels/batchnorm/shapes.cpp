// Batchnorm problem shapes, named after the real models they come from.
//
// ResNet-50's BN layers (PyTorch, NCHW by default and NHWC under channels_last), the BN layers of
// the TensorFlow 2 comparison's Keras CNN (channels-last, 256x256x3 images; the study ran batch 64)
// and the 1-D BN after its dense layer, and a 1-D BN after a 512-wide dense layer (the width of the
// Spark NLP ClassifierDL study's classifier).
#include "kernels/batchnorm/batchnorm.h"

namespace hotops::batchnorm {

const std::vector<NamedShape>& named_shapes() {
  using V = std::vector<std::int64_t>;
  const std::vector<Layout> both{Layout::nchw, Layout::nhwc};
  const std::vector<Layout> keras{Layout::nhwc};
  const std::vector<Layout> dense{Layout::nc};
  static const std::vector<NamedShape> shapes = {
      // ResNet-50 at 224x224: the stem's bn1, then the widest BN of each stage.
      {"resnet50.bn1", both, 64, 112, 112, V{32}},
      {"resnet50.layer1", both, 64, 56, 56, V{1, 32}},
      {"resnet50.layer1_out", both, 256, 56, 56, V{32}},
      {"resnet50.layer2_out", both, 512, 28, 28, V{32}},
      {"resnet50.layer3_out", both, 1024, 14, 14, V{32}},
      {"resnet50.layer4_out", both, 2048, 7, 7, V{1, 32}},
      // The TensorFlow 2 comparison's Keras CNN: its BNs (after conv2d, conv2d_1, conv2d_3) and after
      // its dense layer.
      {"keras_cnn.bn0", keras, 32, 256, 256, V{32}},
      {"keras_cnn.bn1", keras, 64, 85, 85, V{32}},
      {"keras_cnn.bn3", keras, 128, 42, 42, V{32}},
      {"keras_cnn.dense_bn", dense, 1024, 1, 1, V{32, 1024}},
      // A 1-D BN after a 512-wide dense layer.
      {"dense512", dense, 512, 1, 1, V{32}},
  };
  return shapes;
}

}  // namespace hotops::batchnorm
