"""artemis.job"""
