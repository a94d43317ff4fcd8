"""Input pipelines for BERT-family pretraining: text -> tokens -> examples -> masked batches.

TensorFlow serves the file systems (gfile: local, gs://), tfds corpora and tensorflow-text tokenizer ops
for tf.data users; example building and masking are numpy, on a prefetch thread or worker processes.
"""
