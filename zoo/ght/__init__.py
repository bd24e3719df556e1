"""Grouped Head Attention (GHT) and its Pillars of Strength (GHT-PS), Ni et al., ACL 2023.

kmeans      — deterministic k-means in torch (the paper's hidden-unit discovery system)
features    — per-head feature-map points (V, A or O), padding excluded
constraint  — the group-constraint loss and compactness metrics
voting      — Voting-to-Stay: votes per head and the head plan
procedure   — the GCT → voting → fine-tuning schedule as a trainer Procedure
"""
